"""What a run leaves: its record and where records are found, the files they are written
to and read back from, the machine they ran on, and TensorBoard scalars."""
