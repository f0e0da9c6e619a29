"""The engine core: requests, the scheduler and its policies, KV blocks and prefix hashes, the step
loop and its process. Plain Python but for the runner it drives."""
