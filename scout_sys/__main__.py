from scout_sys.cli import main

raise SystemExit(main())
