"""``python -m marin_train``: the same command as ``marin-train``."""

from marin_train.cli import main

if __name__ == "__main__":
    main(prog_name="python -m marin_train")
