"""``convert`` / ``merge``: the plan from the mapping recipes, and the streaming executor per target writer."""
