from modalscope.cli import main

raise SystemExit(main())
