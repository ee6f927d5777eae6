"""Contrastive pre-training: losses, SimCLR/BYOL/SimSiam, the driver, linear evaluation."""
