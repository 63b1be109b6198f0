from rlbench.rehearse.run import main

raise SystemExit(main())
