"""The paper's evidence: its run catalogue (catalogue, dataset_pairs), the claims as data
(claims), the rule that judges them (judge), the engine that finds each claim's runs and
writes claims.md (engine), and the paper's figures (plots)."""
