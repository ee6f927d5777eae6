"""What each method of either stage is: the registries (the self-supervised methods, the
federated methods, their assignment rules and the starts a run may begin from), read by
every layer above, importing nothing of the kit but its errors, plugins and stored
layouts."""
