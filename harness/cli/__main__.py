"""``python -m attnfuzz.harness.cli``: the ``attnfuzz`` command."""

import sys

from attnfuzz.harness.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
