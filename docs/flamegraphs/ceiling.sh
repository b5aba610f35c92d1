#!/bin/bash
# The ceiling of the edge's data path (docs/BENCHMARKS.md, "The ceiling of the
# data path", issue 17): the queue page (SCENARIO c) or its JSON (d) served by
#   edge     waitroom-edge, one worker (the real answer: ticket, decision, page);
#   hyper    waitroom-http-ceiling --server hyper: hyper's HTTP/1 server on the
#            edge's runtime answering every request with the edge's bytes;
#   bare     waitroom-http-ceiling --server bare: the same without hyper
#            (httparse and a buffer, written by hand);
#   nginx    nginx, one process, the same bytes from a static file;
# or, for SCENARIO a (an admitted visitor with a valid cookie, proxied to the
# fast origin, an nginx `return 200 "ok\n"`; b: the same without a cookie, a
# new visitor admitted each request):
#   edge     waitroom-edge, one worker, the cookie's room open wide;
#   hyper    waitroom-http-ceiling --server hyper-proxy: hyper's server and
#            client, no handler, the origin connection in the visitor's task;
#   bare     waitroom-http-ceiling --server bare-proxy: the same by hand;
#   nginx    nginx proxy_pass with keep-alive upstreams (the bench's peer);
# all on CPU 0, each driven in turn by wrk -t1 -c32 on CPU 1, ROUNDS rounds of
# DUR seconds (after a 2 s warm-up each), the order rotating per round.
#
# usage: ceiling.sh TARGET_DIR SCENARIO   (TARGET_DIR holds the release binaries;
#        SCENARIO a, b, c or d)
# env: DUR (default 5), ROUNDS (default 3), CALLGRIND=1 (instead: user-space
#      instructions per request of each server, one 4 s run each).
# Prints one line per run: server, round, req/s, CPU ns per request (utime +
# stime from /proc, whole process).
# Needs root (nginx user root), nginx, wrk, curl (valgrind for CALLGRIND).
set -u
BIN=$1; SCEN=$2
DUR=${DUR:-5}; ROUNDS=${ROUNDS:-3}
D=$(mktemp -d /tmp/ceiling.XXXXXX)
EP=$((20000 + $$ % 10000)); HP=$((EP+1)); BP=$((EP+2)); NP=$((EP+3)); FO=$((EP+4))
H=(); [ "$SCEN" = d ] && H=(-H "Accept: application/json")
PROXIED=0; { [ "$SCEN" = a ] || [ "$SCEN" = b ]; } && PROXIED=1
URLPATH=/queue/page; [ $PROXIED = 1 ] && URLPATH=/product/1
cat > $D/edge.toml <<C
[node]
id = "bench"
listen = "127.0.0.1:$EP"
workers = 1
counters_path = "$D/counters.shm"
max_connections_per_worker = 100000
new_tickets_per_address_per_minute = 0
[[rooms]]
id = "queue"
path = "/queue"
origin = "127.0.0.1:$FO"
total_active_users = 1000
new_users_per_minute = 100
queue_all = true
[[rooms]]
id = "admit"
path = "/"
origin = "127.0.0.1:$FO"
total_active_users = 1000000000
new_users_per_minute = 1000000000
session_duration = 10
ticket_connection_budget = 0
C
nginx_conf() { # name server-block
  cat <<C
daemon off; master_process off; worker_processes 1; user root;
pid $D/$1.pid; error_log $D/$1-error.log warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000;
 client_body_temp_path $D/$1-b; proxy_temp_path $D/$1-p; fastcgi_temp_path $D/$1-f; uwsgi_temp_path $D/$1-u; scgi_temp_path $D/$1-s;
 $2 }
C
}
nginx_conf fo "server { listen 127.0.0.1:$FO; location / { default_type text/plain; return 200 \"ok\\n\"; } }" > $D/fo.conf
nginx_conf nginx "upstream fast { server 127.0.0.1:$FO; keepalive 256; }
 server { listen 127.0.0.1:$NP; location /queue/ { root $D/static; default_type \"$( [ "$SCEN" = d ] && echo application/json || echo text/html )\"; }
  location / { proxy_pass http://fast; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host \$host; proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; } }" > $D/nginx.conf
run() { # name cmd...: start on CPU 0, under callgrind if asked
  local name=$1; shift
  if [ "${CALLGRIND:-0}" = 1 ]; then
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=$D/$name.cg --collect-atstart=yes "$@" > $D/$name.log 2>&1 &
  else
    taskset -c 0 "$@" > $D/$name.log 2>&1 &
  fi
  echo $!
}
taskset -c 0 nginx -c $D/fo.conf & FOPID=$!
EPID=$(run edge $BIN/waitroom-edge --config $D/edge.toml)
for i in $(seq 1 200); do curl -s -o /dev/null http://127.0.0.1:$EP/queue/page && break; sleep 0.2; done
if [ $PROXIED = 1 ]; then
  if [ "$SCEN" = a ]; then
    COOKIE=$(curl -s -D - -o /dev/null http://127.0.0.1:$EP/ | grep -i '^set-cookie' | sed 's/^[^:]*: //; s/;.*//' | tr -d '\r')
    H=(-H "Cookie: $COOKIE")
  fi
  HPID=$(run hyper $BIN/waitroom-http-ceiling --server hyper-proxy --listen 127.0.0.1:$HP --origin 127.0.0.1:$FO)
  BPID=$(run bare $BIN/waitroom-http-ceiling --server bare-proxy --listen 127.0.0.1:$BP --origin 127.0.0.1:$FO)
else
  mkdir -p $D/static/queue
  curl -s "${H[@]}" -o $D/static/queue/page http://127.0.0.1:$EP/queue/page
  curl -s -i "${H[@]}" -o $D/response http://127.0.0.1:$EP/queue/page
  HPID=$(run hyper $BIN/waitroom-http-ceiling --server hyper --listen 127.0.0.1:$HP --response $D/response)
  BPID=$(run bare $BIN/waitroom-http-ceiling --server bare --listen 127.0.0.1:$BP --response $D/response)
fi
NPID=$(run nginx nginx -c $D/nginx.conf)
for p in $HP $BP $NP; do
  for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:$p$URLPATH && break; sleep 0.2; done
done
for p in $EP $HP $BP $NP; do
  echo "port $p: $(curl -s -i "${H[@]}" http://127.0.0.1:$p$URLPATH | head -1 | tr -d '\r'), $(curl -s -i "${H[@]}" http://127.0.0.1:$p$URLPATH | wc -c) bytes"
done
drive() { # name port pid round
  taskset -c 1 wrk -t1 -c32 -d2s "${H[@]}" http://127.0.0.1:$2$URLPATH > /dev/null
  if [ "${CALLGRIND:-0}" = 1 ]; then
    callgrind_control -z $3 > /dev/null
    taskset -c 1 wrk -t1 -c32 -d4s "${H[@]}" http://127.0.0.1:$2$URLPATH > $D/$1.wrk
    callgrind_control -d $3 > /dev/null; sleep 1
    local req=$(awk '/requests in/{print $1}' $D/$1.wrk)
    local f=$(ls -t $D/$1.cg* | head -1)
    local ir=$(grep -m1 '^summary:\|^totals:' $f | awk '{print $2}')
    echo "$1 req=$req Ir/req=$((ir / req))"
  else
    local t0=$(awk '{print $14+$15}' /proc/$3/stat)
    taskset -c 1 wrk -t1 -c32 -d${DUR}s "${H[@]}" http://127.0.0.1:$2$URLPATH > $D/$1.wrk
    local t1=$(awk '{print $14+$15}' /proc/$3/stat)
    local req=$(awk '/requests in/{print $1}' $D/$1.wrk)
    echo "$1 round=$4 rps=$(awk '/Requests\/sec/{print $2}' $D/$1.wrk) cpu_ns/req=$(( (t1-t0)*10000000 / req ))"
  fi
}
SERVERS=("edge $EP $EPID" "hyper $HP $HPID" "bare $BP $BPID" "nginx $NP $NPID")
[ "${CALLGRIND:-0}" = 1 ] && ROUNDS=1
for r in $(seq 1 $ROUNDS); do
  for k in 0 1 2 3; do
    drive ${SERVERS[$(( (k + r - 1) % 4 ))]} $r
  done
done
kill $EPID $HPID $BPID $NPID $FOPID 2>/dev/null; wait 2>/dev/null
echo "dir=$D"
