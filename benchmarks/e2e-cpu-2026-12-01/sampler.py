#!/usr/bin/env python3
"""Samples every process's CPU time (utime+stime) every INTERVAL s; on SIGTERM/SIGINT writes the
per-pid maxima grouped by a label (exe basename + first distinguishing arg) to OUT."""
import os, sys, time, signal, json, collections
out = sys.argv[1]; interval = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
tick = os.sysconf('SC_CLK_TCK')
seen = {}  # (pid, starttime) -> [label, cpu_ticks]
stop = False
def handler(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, handler); signal.signal(signal.SIGINT, handler)
def label(pid):
    try:
        args = open(f'/proc/{pid}/cmdline','rb').read().split(b'\0')
        args = [a.decode(errors='replace') for a in args if a]
    except Exception:
        return None
    if not args: return None
    exe = os.path.basename(args[0])
    extra = ''
    if exe in ('temporal',) and len(args) > 2: extra = ' ' + ' '.join(args[1:3])
    if exe.startswith('twc') and len(args) > 1: extra = ' ' + args[1]
    if exe.startswith('e2e-'): exe = 'e2e-test-binary'
    return exe + extra
def sample():
    for d in os.listdir('/proc'):
        if not d.isdigit(): continue
        try:
            s = open(f'/proc/{d}/stat').read()
        except Exception:
            continue
        r = s.rfind(')'); f = s[r+2:].split()
        cpu = int(f[11]) + int(f[12]); start = f[19]
        key = (d, start)
        if key not in seen:
            l = label(d)
            if l is None: l = s[s.find('(')+1:r]
            seen[key] = [l, cpu, time.time(), time.time()]
        else:
            seen[key][1] = max(seen[key][1], cpu); seen[key][3] = time.time()
t0 = time.time(); cpu0 = open('/proc/stat').readline().split()[1:9]
while not stop:
    sample(); time.sleep(interval)
cpu1 = open('/proc/stat').readline().split()[1:9]
agg = collections.defaultdict(lambda: [0.0, 0])
for (pid, _), (l, c, *_r) in seen.items():
    agg[l][0] += c / tick; agg[l][1] += 1
busy = sum(int(b) - int(a) for i, (a, b) in enumerate(zip(cpu0, cpu1)) if i not in (3, 4)) / tick
rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
with open(out, 'w') as f:
    f.write(f"# wall {time.time()-t0:.0f} s, machine busy {busy:.0f} CPU-s (user+nice+system+irq+softirq+steal), sampled every {interval} s\n")
    for l, (c, n) in rows:
        if c >= 1: f.write(f"{c:9.1f} CPU-s  {n:5d} procs  {l}\n")
    f.write("# per process (>= 2 CPU-s): cpu, lifetime seen, label\n")
    for (pid, _), (l, c, a, b) in sorted(seen.items(), key=lambda kv: kv[1][2]):
        if c / tick >= 2: f.write(f"{c/tick:8.1f} {a-t0:7.0f} {b-a:6.0f} {pid} {l}\n")
