"""``python -m dpcurator.cli``: the same as ``dpcurator``."""

from dpcurator.cli.app import main

if __name__ == "__main__":
    main()
