import sys

from worker.app import main

sys.exit(main())
