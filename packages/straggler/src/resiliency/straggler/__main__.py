"""``python -m resiliency.straggler HISTORY -o heatmap.png``: the heatmap command line."""

from resiliency.straggler.heatmap import main

raise SystemExit(main())
