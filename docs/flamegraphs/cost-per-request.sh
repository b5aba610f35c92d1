#!/bin/bash
# Cost per request of waitroom-edge against nginx proxy_pass, robust to a
# loaded machine (docs/BENCHMARKS.md, "Cost per request", issue 17).
#
# usage: cost-per-request.sh EDGE_BIN MODE SCENARIO
#   MODE callgrind: user-space instructions per request (valgrind's callgrind,
#                   counters zeroed after a 2 s warm-up, dumped after the run);
#                   the dump (cg.out.1) is left for callgrind_annotate.
#        cpu:       CPU time per request (utime + stime from /proc).
#   SCENARIO a: admitted visitor with a valid cookie; b: new visitor;
#            c: new visitor queued, the queue page (nginx: the same bytes,
#            static); d: the same as JSON (Accept: application/json).
# env: DUR (seconds of the measured wrk run, default 6), SKIP_NGINX=1 (edge
#      only), PERF=file (cpu mode: perf record -g the edge during the run),
#      ACCESS_LOG=json|combined (the edge writes its access log to a file),
#      BUDGET=n (scenario a's ticket_connection_budget, default 0: wrk's one
#      cookie on 32 connections is over any budget), CONNS=n (wrk's
#      connections, default 32; at most BUDGET for a budget that holds).
# Starts the fast origin (nginx return 200), the nginx peer (proxy_pass, one
# process) and the edge with one worker, all on CPU 0; wrk -t1 -c32 on CPU 1.
# Needs root (nginx user root), nginx, wrk, valgrind, curl.
set -u
EDGE=$1; MODE=$2; SCEN=$3
D=$(mktemp -d /tmp/cost-per-request.XXXXXX)
FO=$((20000 + $$ % 10000)); PEER=$((FO+1)); EP=$((FO+2))
common() { cat <<C
daemon off; master_process off; worker_processes 1; user root;
pid $D/$1.pid; error_log $D/$1-error.log warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000;
 client_body_temp_path $D/$1-b; proxy_temp_path $D/$1-p; fastcgi_temp_path $D/$1-f; uwsgi_temp_path $D/$1-u; scgi_temp_path $D/$1-s;
C
}
{ common fo; echo "server { listen 127.0.0.1:$FO; location / { default_type text/plain; return 200 \"ok\n\"; } } }"; } > $D/fo.conf
{ common peer; echo "upstream fast { server 127.0.0.1:$FO; keepalive 256; }
server { listen 127.0.0.1:$PEER; location /queue/ { root $D/static; default_type \"$( [ "$SCEN" = d ] && echo application/json || echo text/html )\"; } location / { proxy_pass http://fast; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host \$host; proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; } } }"; } > $D/peer.conf
cat > $D/edge.toml <<C
[node]
id = "bench"
listen = "127.0.0.1:$EP"
workers = 1
counters_path = "$D/counters.shm"
max_connections_per_worker = 100000
new_tickets_per_address_per_minute = 0
$( [ -n "${ACCESS_LOG:-}" ] && printf '[node.access_log]\nenabled = true\npath = "%s/access.log"\nformat = "%s"' "$D" "$ACCESS_LOG" )
[[rooms]]
id = "admit"
path = "/"
origin = "127.0.0.1:$FO"
total_active_users = 1000000000
new_users_per_minute = 1000000000
session_duration = 10
ticket_connection_budget = ${BUDGET:-0}
[[rooms]]
id = "queue"
path = "/queue"
origin = "127.0.0.1:$FO"
total_active_users = 1000
new_users_per_minute = 100
queue_all = true
C
taskset -c 0 nginx -c $D/fo.conf & FOPID=$!
sleep 0.3
if [ "$MODE" = callgrind ]; then
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=$D/cg.out --collect-atstart=yes $EDGE --config $D/edge.toml > $D/edge.log 2>&1 & EPID=$!
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=$D/cgn.out nginx -c $D/peer.conf > $D/peer.log 2>&1 & PPID2=$!
else
  taskset -c 0 $EDGE --config $D/edge.toml > $D/edge.log 2>&1 & EPID=$!
  taskset -c 0 nginx -c $D/peer.conf & PPID2=$!
fi
for i in $(seq 1 200); do curl -s -o /dev/null http://127.0.0.1:$EP/ && curl -s -o /dev/null http://127.0.0.1:$PEER/ && break; sleep 0.2; done
COOKIE=$(curl -s -D - -o /dev/null http://127.0.0.1:$EP/ | grep -i '^set-cookie' | sed 's/^[^:]*: //; s/;.*//' | tr -d '\r')
H=(); [ "$SCEN" = a ] && H=(-H "Cookie: $COOKIE")
URLPATH=/product/1
if [ "$SCEN" = c ] || [ "$SCEN" = d ]; then
  URLPATH=/queue/page
  [ "$SCEN" = d ] && H=(-H "Accept: application/json")
  mkdir -p $D/static/queue
  curl -s "${H[@]}" -o $D/static/queue/page http://127.0.0.1:$EP/queue/page
fi
drive() { # port pid name
  if [ "$MODE" = callgrind ]; then
    taskset -c 1 wrk -t1 -c${CONNS:-32} -d2s "${H[@]}" http://127.0.0.1:$1$URLPATH > /dev/null  # warm
    callgrind_control -z $2 > /dev/null
    taskset -c 1 wrk -t1 -c${CONNS:-32} -d${DUR:-6}s "${H[@]}" http://127.0.0.1:$1$URLPATH > $D/$3.wrk
    callgrind_control -d $2 > /dev/null; sleep 1
    REQ=$(awk '/requests in/{print $1}' $D/$3.wrk)
    F=$(ls -t $D/$4.out* | head -1)
    IR=$(grep -m1 '^summary:\|^totals:' $F | awk '{print $2}')
    echo "$3 req=$REQ Ir=$IR Ir/req=$((IR / REQ)) file=$F"
  else
    taskset -c 1 wrk -t1 -c${CONNS:-32} -d2s "${H[@]}" http://127.0.0.1:$1$URLPATH > /dev/null
    T0=$(awk '{print $14+$15}' /proc/$2/stat)
    if [ -n "${PERF:-}" ] && [ "$3" = edge ]; then perf record -F 499 --call-graph dwarf,16384 -p $2 -o $PERF -- sleep 4 > /dev/null 2>&1 & fi
    taskset -c 1 wrk -t1 -c${CONNS:-32} -d${DUR:-6}s "${H[@]}" http://127.0.0.1:$1$URLPATH > $D/$3.wrk
    T1=$(awk '{print $14+$15}' /proc/$2/stat)
    REQ=$(awk '/requests in/{print $1}' $D/$3.wrk); RPS=$(awk '/Requests\/sec/{print $2}' $D/$3.wrk)
    echo "$3 req=$REQ rps=$RPS cpu_us/req=$(( (T1-T0)*10000000 / REQ ))"
  fi
}
drive $EP $EPID edge cg
[ "${SKIP_NGINX:-0}" = 1 ] || drive $PEER $PPID2 nginx cgn
kill $EPID $PPID2 $FOPID 2>/dev/null; wait 2>/dev/null
echo "dir=$D"
