"""The fix for a watched loader: the module written in its place (`dali`, `dataloader`: `probe
migrate`), the setting it takes (`setting`), and each candidate measured on the job itself
(`tune`: `probe tune`)."""
