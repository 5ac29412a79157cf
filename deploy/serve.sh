#!/usr/bin/env bash
# attnviz for a class: N Streamlit replicas behind nginx, one address, sticky sessions.
#
#   deploy/serve.sh --replicas N --port PORT [--bind ADDRESS]
#
# Starts N app processes on 127.0.0.1 (ports PORT+1 .. PORT+N) sharing one cookie secret, and
# nginx in front of them on ADDRESS:PORT (default 127.0.0.1). A replica that dies is started again.
# It stays in the foreground and stops everything it started on SIGTERM or Ctrl-C, by process id.
#
# Why replicas: one Streamlit process runs every session's script in threads under one GIL, so
# it uses about one core however many the machine has; N processes use N. Why sticky: a session's
# state, its websocket and its download files live in the one process that served it, so a
# browser must keep reaching that process. nginx routes on a cookie (attnviz_route) it sets on the
# first request; the open-source nginx has no "sticky" directive, so the cookie is hashed
# (consistent hashing keeps the other sessions in place if a replica is added).
# Why one cookie secret: every replica must accept the cookies (XSRF) that another one signed.
#
# Environment: ATTNVIZ_COOKIE_SECRET (default: a random one per start of serve.sh; set one, and open
# pages reconnect across a restart of serve.sh itself too), and every setting the app
# reads (ATTNVIZ_MODEL_ROOTS, ATTNVIZ_MAX_*, ATTNVIZ_ROOM*). A class's rooms live in one SQLite file
# every replica opens, ATTNVIZ_ROOMS_DIR (default ~/.cache/attnviz/rooms: the same for all of them),
# or in Redis (ATTNVIZ_ROOMS_URL). Requires nginx (Debian: apt-get install -y nginx).
set -euo pipefail

replicas=2
port=8501
bind=127.0.0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="${2:-}"; shift 2 ;;
    --port) port="${2:-}"; shift 2 ;;
    --bind) bind="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$replicas" in ''|*[!0-9]*) echo "serve.sh: --replicas must be a whole number, got '$replicas'" >&2; exit 2 ;; esac
case "$port" in ''|*[!0-9]*) echo "serve.sh: --port must be a whole number, got '$port'" >&2; exit 2 ;; esac
if [ "$replicas" -lt 1 ] || [ "$replicas" -gt 64 ]; then
  echo "serve.sh: --replicas must be between 1 and 64, got $replicas" >&2; exit 2
fi
if [ "$port" -lt 1024 ] || [ $((port + replicas)) -gt 65535 ]; then
  echo "serve.sh: --port must leave room for $replicas replica ports above it (1024..$((65535 - replicas)))" >&2; exit 2
fi
command -v nginx >/dev/null || { echo "serve.sh: nginx is not installed (apt-get install -y nginx)" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d -t attnviz-serve.XXXXXX)"
secret="${ATTNVIZ_COOKIE_SECRET:-$("$python" -c 'import secrets; print(secrets.token_hex(32))')}"
pids=()

stop() {
  trap - TERM INT EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap 'stop; exit 0' TERM INT
trap stop EXIT

# replica I PORT: run replica I on PORT, and start it again whenever it exits (a crash, a kill -9),
# with the same cookie secret: its visitors' pages reconnect by themselves, and a class's rooms live
# in their store, not in the replica. One that exits within RESTART_AFTER_S of its start is broken,
# not crashed: it is not started again, and serve.sh stops (below). SIGTERM stops it and its server.
RESTART_AFTER_S=10
replica() {
  local i=$1 p=$2 child="" started
  trap 'kill -TERM $child 2>/dev/null; wait $child 2>/dev/null; exit 0' TERM
  while true; do
    started=$SECONDS
    # Streamlit takes the secret from its environment only (never on a command line, where ps shows it).
    (cd "$root" && STREAMLIT_SERVER_COOKIE_SECRET="$secret" exec "$python" -m streamlit run app.py \
        --server.headless true --server.address 127.0.0.1 --server.port "$p") >>"$work/replica-$i.log" 2>&1 &
    child=$!
    wait "$child" || true
    if [ $((SECONDS - started)) -lt "$RESTART_AFTER_S" ]; then
      echo "serve.sh: replica $i (port $p) exited $((SECONDS - started)) s after its start; not starting it again" >&2
      exit 1
    fi
    echo "serve.sh: replica $i (port $p) exited; starting it again" >&2
  done
}

upstreams=""
for i in $(seq 1 "$replicas"); do
  p=$((port + i))
  replica "$i" "$p" &
  pids+=("$!")
  upstreams="$upstreams        server 127.0.0.1:$p max_fails=0;"$'\n'
done

mkdir -p "$work/temp"
chmod 0755 "$work" && chmod 1777 "$work/temp"  # nginx's workers drop root for an unprivileged user
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    server_tokens off;  # no nginx version in headers and error pages
    client_body_temp_path $work/temp/body;
    proxy_temp_path $work/temp/proxy;
    fastcgi_temp_path $work/temp/fastcgi;
    uwsgi_temp_path $work/temp/uwsgi;
    scgi_temp_path $work/temp/scgi;
    # A browser keeps its route; a first visit gets one (the request id), sent back as a cookie.
    map \$cookie_attnviz_route \$attnviz_route {
        "" \$request_id;
        default \$cookie_attnviz_route;
    }
    map \$http_upgrade \$connection_upgrade {
        default upgrade;
        "" close;
    }
    upstream attnviz {
        hash \$attnviz_route consistent;
$upstreams    }
    server {
        listen $bind:$port;
        client_max_body_size 8m;
        # A shared link holds the view's text (a sentence, pasted lines): room for long ones, not 8k.
        large_client_header_buffers 4 128k;
        location / {
            add_header Set-Cookie "attnviz_route=\$attnviz_route; Path=/; HttpOnly; SameSite=Lax" always;
            proxy_pass http://attnviz;
            proxy_http_version 1.1;
            proxy_set_header Host \$host;
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_read_timeout 1h;
            proxy_buffering off;
        }
    }
}
EOF

for i in $(seq 1 "$replicas"); do
  p=$((port + i))
  for _ in $(seq 1 120); do
    if "$python" -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$p/_stcore/health', timeout=1)" 2>/dev/null; then
      break
    fi
    if ! kill -0 "${pids[$((i - 1))]}" 2>/dev/null; then
      echo "serve.sh: replica $i did not start; its log:" >&2; tail -20 "$work/replica-$i.log" >&2; exit 1
    fi
    sleep 0.5
  done
done

# A fresh replica imports torch, loads the model and computes the first page on its first visit
# (about 4 s on 2 cores): a class opening the link at once would wait behind it. Visit each once.
for i in $(seq 1 "$replicas"); do
  (cd "$root" && "$python" -m attnviz.app.visit --port $((port + i))) || echo "serve.sh: replica $i's first visit showed a problem (above)" >&2
done

nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;' &
pids+=("$!")
echo "attnviz: $replicas replica(s) behind nginx at http://$bind:$port (pids ${pids[*]}); Ctrl-C stops them" >&2
# Stay in the foreground until a process ends or a signal arrives (the trap stops the rest).
wait -n "${pids[@]}" || true
echo "serve.sh: a process ended; stopping the rest" >&2
exit 1
