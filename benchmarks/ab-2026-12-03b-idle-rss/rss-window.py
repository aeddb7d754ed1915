import re, sys, statistics, datetime
# usage: rss-window.py DIR RUN... : VmRSS and RssAnon (MiB) by minute of the idle window
d = sys.argv[1]
for run in sys.argv[2:]:
    t0 = win = None
    for line in open(f"{d}/{run}.log", errors="replace"):
        if "measuring idle cost" in line:
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            ts = line.split()[0]
            t0 = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
            m = re.search(r"window=([0-9.]+)s", line); win = float(m.group(1)) if m else 480.0
            break
    rows = [tuple(map(float, l.split())) for l in open(f"{d}/{run}.rss.txt") if len(l.split()) == 4]
    print(f"{run}: window from {datetime.datetime.utcfromtimestamp(t0):%H:%M:%S} for {win:.0f} s; minute of the window: VmRSS median / RssAnon median / RssFile median (MiB)")
    for k in range(int(win // 60 + 0.999)):
        b = [r for r in rows if t0 + 60 * k <= r[0] < min(t0 + 60 * (k + 1), t0 + win)]
        if b:
            f = lambda i: statistics.median(r[i] for r in b) / 1024
            print(f"  {k:2d}  {f(1):6.1f} {f(2):6.1f} {f(3):6.1f}  ({len(b)} samples)")
    for name, lo, hi in (("whole window", 0, win), ("last 120 s", win - 120, win)):
        b = [r for r in rows if t0 + lo <= r[0] < t0 + hi]
        f = lambda i: statistics.median(r[i] for r in b) / 1024
        print(f"  {name}: VmRSS {f(1):.1f}, RssAnon {f(2):.1f}, RssFile {f(3):.1f}")
