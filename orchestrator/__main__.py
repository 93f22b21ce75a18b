from orchestrator.cli.wakeloop import main

raise SystemExit(main())
