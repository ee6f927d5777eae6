"""The paper's evidence: its run catalogue (catalogue, dataset_pairs), the claims as data
(claims), the rule that judges them (judge), a tree's runs per claim and seed (tree), a
claim judged on them (judging), the report claims.md (claims_report), where its runs came
from (provenance), results/README.md's table (readme_table), and the paper's figures
(plots)."""
