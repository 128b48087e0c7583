"""``python -m producer ...`` is the ``harvest`` command."""

import sys

from producer.cli import main

sys.exit(main())
