"""The run loop: the driver, its staging of commits, tool rounds, inference, resume, and the
pure folds and decisions it runs on."""
