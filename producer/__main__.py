"""``python -m harvest_outbox.producer ...`` is the ``harvest`` command."""

import sys

from harvest_outbox.producer.cli import main

sys.exit(main())
