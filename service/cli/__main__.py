"""``python -m service.cli``: the same as ``dpcurator``."""

from service.cli.app import main

if __name__ == "__main__":
    main()
