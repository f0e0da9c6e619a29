"""`python -m surge.cli ...`: the autoscaler's replicas and the gateway start this way."""

import sys

from surge.cli.main import main

sys.exit(main())
