import sys

from runner.worker.supervisor import main

sys.exit(main())
