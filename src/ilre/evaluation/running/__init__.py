"""What runs the strategies and the baselines on the tasks' samples and records raw results: the plan, the
runner of `ilre eval`, the scoring, the outside peers (BM25, LLMLingua) and the checks beyond the suite."""
