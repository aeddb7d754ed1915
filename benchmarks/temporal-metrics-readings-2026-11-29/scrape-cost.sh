#!/usr/bin/env bash
# CPU the Temporal dev server spends on readings of its /metrics page: its utime+stime (clock
# ticks of 1/100 s, /proc/PID/stat) over a window without readings and a window of N back-to-back
# readings, both of the same length, repeated. Usage: scrape-cost.sh PID PORT N ROUNDS
PID=$1; PORT=$2; N=${3:-10}; ROUNDS=${4:-3}
cpu(){ awk '{print $14+$15}' /proc/$PID/stat; }
echo "# $(date -u +%FT%TZ) pid=$PID port=$PORT readings per window=$N clk_tck=$(getconf CLK_TCK)"
for r in $(seq 1 $ROUNDS); do
  a=$(cpu); s=$(date +%s%N); bytes=0
  for i in $(seq 1 $N); do b=$(curl -s -o /dev/null -w "%{size_download}" http://127.0.0.1:$PORT/metrics); bytes=$((bytes+b)); done
  z=$(cpu); e=$(date +%s%N); ms=$(( (e-s)/1000000 ))
  echo "round=$r readings=$N ms=$ms ticks=$((z-a)) mean_page_bytes=$((bytes/N))"
  a=$(cpu); sleep $(awk "BEGIN{print $ms/1000}"); z=$(cpu)
  echo "round=$r no-readings ms=$ms ticks=$((z-a))"
done
