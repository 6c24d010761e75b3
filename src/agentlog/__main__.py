"""`python -m agentlog ...` is the `agentlog` command line."""

from agentlog.cli import main

if __name__ == "__main__":
    main()
