"""Config plumbing every part shares: dataclass fields as command-line flags (`flags`) and the
environment, read in one place (`settings`)."""
