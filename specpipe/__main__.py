from specpipe.cli import main
import sys
sys.exit(main())
