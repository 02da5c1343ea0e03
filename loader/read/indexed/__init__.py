"""Datasets indexed in place (``stoker index``): Parquet row groups and WebDataset samples read
where they are (:mod:`.source`), staged rounds from decoded row groups (:mod:`.row_groups`) and
their records kept on the node (:mod:`.group_records`)."""
