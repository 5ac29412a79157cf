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
    --replicas|--port|--bind)
      [ $# -ge 2 ] || { echo "serve.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --replicas) replicas="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --bind) bind="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$replicas" in ''|*[!0-9]*) echo "serve.sh: --replicas must be a whole number, got '$replicas'" >&2; exit 2 ;; esac
case "$port" in ''|*[!0-9]*) echo "serve.sh: --port must be a whole number, got '$port'" >&2; exit 2 ;; esac
# In decimal, whatever leading zeros (bash reads 018770 as octal, and failed on it), and short enough not to wrap.
if [ ${#replicas} -gt 6 ] || [ ${#port} -gt 6 ]; then
  echo "serve.sh: --replicas and --port must be at most 64 and 65535" >&2; exit 2
fi
replicas=$((10#$replicas))
port=$((10#$port))
if [ "$replicas" -lt 1 ] || [ "$replicas" -gt 64 ]; then
  echo "serve.sh: --replicas must be between 1 and 64, got $replicas" >&2; exit 2
fi
if [ "$port" -lt 1024 ] || [ $((port + replicas)) -gt 65535 ]; then
  echo "serve.sh: --port must leave room for $replicas replica ports above it (1024..$((65535 - replicas)))" >&2; exit 2
fi
command -v nginx >/dev/null || { echo "serve.sh: nginx is not installed (apt-get install -y nginx)" >&2; exit 2; }
case "$bind" in *:*) case "$bind" in \[*) ;; *) bind="[$bind]" ;; esac ;; esac  # an IPv6 address, as nginx takes it

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
# Every port it will listen on free, before anything starts: nginx had failed to bind only after the replicas
# were started and visited, and after serve.sh had said it was serving.
"$python" - "$bind" "$port" "$replicas" <<'PY' || exit 2
import socket, sys
bind, port, replicas = sys.argv[1].strip("[]"), int(sys.argv[2]), int(sys.argv[3])
for host, p in [(bind, port)] + [("127.0.0.1", port + i) for i in range(1, replicas + 1)]:
    try:
        family = socket.getaddrinfo(host, p, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as nginx and Streamlit bind
            s.bind((host, p))
    except OSError as e:
        sys.exit(f"serve.sh: cannot listen on {host}:{p}: {e.strerror or e}")
PY
work="$(mktemp -d -t attnviz-serve.XXXXXX)"
secret="${ATTNVIZ_COOKIE_SECRET:-$("$python" -c 'import secrets; print(secrets.token_hex(32))')}"
pids=()
visit=""

stop() {
  trap '' TERM INT  # a second Ctrl-C while it stops: it still stops everything and removes $work
  trap - EXIT
  for pid in "${pids[@]}" $visit; do kill -TERM "$pid" 2>/dev/null || true; done
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
STOP_S=10
replica() {
  local i=$1 p=$2 child="" started
  # SIGTERM: Streamlit's own shutdown, for up to STOP_S, then SIGKILL (its fork server and workers end with it).
  # A replica stopped by a Ctrl-C in a loaded full test run once outlived its SIGTERM by over a minute.
  trap 'kill -TERM $child 2>/dev/null; for _ in $(seq 1 $((STOP_S * 10))); do kill -0 $child 2>/dev/null || break; sleep 0.1; done; kill -KILL $child 2>/dev/null; wait $child 2>/dev/null; exit 0' TERM
  trap '' INT  # a Ctrl-C is serve.sh's to act on: it stops every replica by its process id
  while true; do
    started=$SECONDS
    # Streamlit takes the secret from its environment only (never on a command line, where ps shows it).
    # In a process group of its own (setsid), as nginx: a Ctrl-C reaches serve.sh alone, which stops it by its id.
    (cd "$root" && STREAMLIT_SERVER_COOKIE_SECRET="$secret" exec setsid "$python" -m streamlit run app.py \
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
  upstreams="$upstreams        server 127.0.0.1:$((port + i)) max_fails=0;"$'\n'
done

mkdir -p "$work/temp"
chmod 0755 "$work" && chmod 1777 "$work/temp"  # nginx's workers drop root for an unprivileged user
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid "$work/nginx.pid";
error_log "$work/nginx-error.log" warn;
events { worker_connections 4096; }
http {
    access_log off;
    server_tokens off;  # no nginx version in headers and error pages
    client_body_temp_path "$work/temp/body";
    proxy_temp_path "$work/temp/proxy";
    fastcgi_temp_path "$work/temp/fastcgi";
    uwsgi_temp_path "$work/temp/uwsgi";
    scgi_temp_path "$work/temp/scgi";
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
# The configuration checked now, not after the replicas' start: a mistake in it is one line, at once.
if ! nginx -t -q -p "$work" -c "$work/nginx.conf" 2>"$work/nginx-test.log"; then
  echo "serve.sh: nginx refuses its configuration: $(grep -m1 emerg "$work/nginx-test.log" || tail -1 "$work/nginx-test.log")" >&2
  exit 2
fi

for i in $(seq 1 "$replicas"); do
  replica "$i" $((port + i)) &
  pids+=("$!")
done

for i in $(seq 1 "$replicas"); do
  p=$((port + i))
  healthy=0
  for _ in $(seq 1 120); do
    if "$python" -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$p/_stcore/health', timeout=1)" 2>/dev/null; then
      healthy=1
      break
    fi
    if ! kill -0 "${pids[$((i - 1))]}" 2>/dev/null; then
      echo "serve.sh: replica $i did not start; its log:" >&2; tail -20 "$work/replica-$i.log" >&2; exit 1
    fi
    sleep 0.5
  done
  if [ "$healthy" != 1 ]; then
    echo "serve.sh: replica $i (port $p) did not answer its health check within a minute; its log:" >&2
    tail -20 "$work/replica-$i.log" >&2; exit 1
  fi
done

# A fresh replica imports torch, loads the model and computes the first page on its first visit
# (about 4 s on 2 cores): a class opening the link at once would wait behind it. Visit each once.
# In the background, waited for: a SIGTERM or Ctrl-C meanwhile stops serve.sh at once, not after the visit.
for i in $(seq 1 "$replicas"); do
  (cd "$root" && exec "$python" -m attnviz.app.visit --port $((port + i))) &
  visit=$!
  wait "$visit" || echo "serve.sh: replica $i's first visit showed a problem (above)" >&2
  visit=""  # waited for: its process id may be another process's now
done

# In a process group of its own: a Ctrl-C reaches serve.sh, which stops nginx by its process id, where nginx
# had also taken it and ended first, and serve.sh had said a process ended.
setsid nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;' &
pids+=("$!")
nginx_pid=$!
for _ in $(seq 1 100); do  # serving once nginx answers, not before
  if "$python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$((port + 1))/_stcore/health', timeout=1)" 2>/dev/null \
    && "$python" - "$bind" "$port" <<'PY' 2>/dev/null; then
import socket, sys
socket.create_connection((sys.argv[1].strip("[]"), int(sys.argv[2])), timeout=1).close()
PY
    break
  fi
  if ! kill -0 "$nginx_pid" 2>/dev/null; then
    echo "serve.sh: nginx did not start; its log:" >&2; tail -5 "$work/nginx-error.log" >&2; exit 1
  fi
  sleep 0.1
done
echo "attnviz: $replicas replica(s) behind nginx at http://$bind:$port (pids ${pids[*]}); Ctrl-C stops them" >&2
# Stay in the foreground until a process ends or a signal arrives (the trap stops the rest).
wait -n "${pids[@]}" || true
echo "serve.sh: a process ended; stopping the rest" >&2
exit 1
