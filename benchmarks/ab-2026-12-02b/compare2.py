import json,os
here=os.path.dirname(os.path.abspath(__file__))
runs=[r for r in ['old4','new4','old5','new5'] if os.path.exists(f'{here}/{r}.json')]
d={r:json.load(open(f'{here}/{r}.json')) for r in runs}
def g(r,path):
    v=d[r]
    for p in path.split('.'):
        v=v.get(p) if isinstance(v,dict) else None
    return v
figs=[('burst.all_ready_after_last_poller_s','burst of 100: every TWD Ready after the last first poller (s)','%.1f'),
('burst.all_ready_after_apply_s','burst of 100: every TWD Ready after the apply (s)','%.1f'),
('burst.last_poller_after_apply_s','burst of 100: last first poller after the apply (s)','%.1f'),
('burst.peak_server_reads_per_s','burst: reads served by Temporal, highest 10 s mean (/s)','%.1f'),
('burst.rate_limited_calls','burst: calls refused for rate or concurrency limits','%.0f'),
('burst.busy_refusals','burst: busy refusals (retried)','%.0f'),
('burst.controller_peak_rss_mib','burst: controller peak RSS (MiB)','%.1f'),
('burst.controller_cpu_s','burst: controller CPU (s)','%.2f'),
('burst.temporal_cpu_s','burst: dev server CPU (s)','%.1f'),
('burst.machine_busy_pct','burst: machine busy (%)','%.1f'),
('idle.reads_per_twd_per_5min','idle: reads per TWD per 5 min','%.2f'),
('idle.server_reads_per_min.median','idle: reads served a minute, p50','%.1f'),
('idle.server_reads_per_min.p95','idle: reads served a minute, p95','%.1f'),
('idle.kube_requests_per_twd_per_min','idle: Kubernetes requests per TWD a minute','%.2f'),
('idle.controller_cpu_pct.median','idle: controller CPU % p50','%.2f'),
('idle.controller_rss_mib.median','idle: controller RSS p50 (MiB)','%.1f'),
('idle.controller_rss_mib.p95','idle: controller RSS p95 (MiB)','%.1f'),
('idle.twd_workflows.events_per_twd_per_5min','idle: TWD workflow events per TWD per 5 min','%.2f')]
print('| figure | '+' | '.join(runs)+' |'); print('|---'*(len(runs)+1)+'|')
for p,n,f in figs:
    print(f'| {n} | '+' | '.join('–' if g(r,p) is None else f % g(r,p) for r in runs)+' |')
print()
for p,n,f in figs:
    o=[g(r,p) for r in runs if r.startswith('old') and g(r,p) is not None]
    w=[g(r,p) for r in runs if r.startswith('new') and g(r,p) is not None]
    if o and w and sum(o):
        mo=sum(o)/len(o); mw=sum(w)/len(w)
        print(f"{n}: old {'/'.join(f%x for x in o)}, new {'/'.join(f%x for x in w)}, new/old {100*(mw/mo-1):+.0f} %")
