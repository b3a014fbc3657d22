import sys
import kvmem.bench.needle as n
d = float(sys.argv.pop(1))
n.even_depths = lambda k: (d,)
from kvmem.bench.main import main
sys.exit(main())
