"""``python -m harvest_outbox.producer ...`` is the ``harvest`` command."""

import sys

from harvest_outbox.producer.ops.cli import main

sys.exit(main())
