#!/usr/bin/env bash
# A local three-node quotad cluster sharing one redis-server, for `make
# cluster`: node-1 to node-3 on 127.0.0.1 to 127.0.0.3, gossip encrypted
# with a fresh key. It starts Redis and waits until it answers, starts the
# nodes and waits until each listens and sees all three members, then
# stays in the foreground, saying when a node or Redis dies, until Ctrl-C
# (or SIGTERM) stops everything.
#
# Environment: QUOTAD_BIN (the quotad binary, required), CLUSTER_REDIS_PORT
# (6390), CLUSTER_API_PORT (8080), CLUSTER_GOSSIP_PORT (7946),
# CLUSTER_START_TIMEOUT (seconds to wait for each process, 20), CLUSTER_DIR
# (where logs and the key go; a new temporary directory).
set -u

bin=${QUOTAD_BIN:?set QUOTAD_BIN to the quotad binary}
redis_port=${CLUSTER_REDIS_PORT:-6390}
api_port=${CLUSTER_API_PORT:-8080}
gossip_port=${CLUSTER_GOSSIP_PORT:-7946}
start_timeout=${CLUSTER_START_TIMEOUT:-20}

say() { echo "make cluster: $*" >&2; }
die() { say "$*"; exit 1; }

declare -A pids=() # name -> pid of what this script started
stop() {
	trap - EXIT INT TERM
	[ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
	wait 2>/dev/null
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# listening reports whether something accepts TCP connections on $1:$2.
listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# A taken port would otherwise go unnoticed: a Redis already there would
# serve the nodes instead of ours, and a node losing its port would exit.
for addr in "127.0.0.1 $redis_port Redis CLUSTER_REDIS_PORT" \
	"127.0.0.1 $api_port API CLUSTER_API_PORT" "127.0.0.2 $api_port API CLUSTER_API_PORT" "127.0.0.3 $api_port API CLUSTER_API_PORT" \
	"127.0.0.1 $gossip_port gossip CLUSTER_GOSSIP_PORT" "127.0.0.2 $gossip_port gossip CLUSTER_GOSSIP_PORT" "127.0.0.3 $gossip_port gossip CLUSTER_GOSSIP_PORT"; do
	read -r host port what var <<<"$addr"
	if listening "$host" "$port"; then
		die "$host:$port, the $what port, is already in use (another Redis or quotad?); stop what listens there or choose another port: make cluster $var=<port>"
	fi
done

# tail_of prints the end of a process's log, indented.
tail_of() { tail -n "${2:-5}" "$1" | sed 's/^/    /' >&2; }

# await waits until $name's process listens on $host:$port; if it exits
# first, or takes longer than start_timeout, it says so and fails.
await() {
	local name=$1 host=$2 port=$3 log=$4
	local deadline=$((SECONDS + start_timeout))
	until listening "$host" "$port"; do
		if ! kill -0 "${pids[$name]}" 2>/dev/null; then
			say "$name exited before it listened on $host:$port; its log ($log) ends:"
			tail_of "$log" 10
			exit 1
		fi
		if [ $SECONDS -ge $deadline ]; then
			say "$name did not listen on $host:$port within ${start_timeout}s; its log ($log) ends:"
			tail_of "$log" 10
			exit 1
		fi
		sleep 0.1
	done
}

# cluster_size prints the cluster's size as the node on $host:$port sees
# it (GET /cluster, over bash's /dev/tcp).
cluster_size() {
	local reply
	exec 3<>"/dev/tcp/$1/$2" || return 1
	printf 'GET /cluster HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" >&3
	reply=$(cat <&3)
	exec 3<&-
	sed -n 's/^ *"size": *\([0-9]*\),.*/\1/p' <<<"$reply" | head -n 1
}

# await_members waits until the node on $host:$port sees all three
# members: nodes join in the background, after they listen.
await_members() {
	local name=$1 host=$2 port=$3 log=$4
	local deadline=$((SECONDS + start_timeout))
	until [ "$(cluster_size "$host" "$port" 2>/dev/null)" = 3 ]; do
		if [ $SECONDS -ge $deadline ]; then
			say "$name does not see three members after ${start_timeout}s; its log ($log) ends:"
			tail_of "$log" 10
			exit 1
		fi
		sleep 0.1
	done
}

dir=${CLUSTER_DIR:-$(mktemp -d)}
head -c 32 /dev/urandom | base64 >"$dir/gossip.key"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pids[redis]=$!
await redis 127.0.0.1 "$redis_port" "$dir/redis.log"
until [ "$(redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null)" = PONG ]; do sleep 0.1; done

for i in 1 2 3; do
	"$bin" --listen "127.0.0.$i:$api_port" --redis "redis://127.0.0.1:$redis_port/0" \
		--cluster-addr "127.0.0.$i:$gossip_port" --join "127.0.0.1:$gossip_port" \
		--node-name "node-$i" --cluster-key-file "$dir/gossip.key" >"$dir/node-$i.out" 2>"$dir/node-$i.log" &
	pids[node-$i]=$!
done
for i in 1 2 3; do
	await "node-$i" "127.0.0.$i" "$api_port" "$dir/node-$i.log"
	echo "node-$i: http://127.0.0.$i:$api_port (pid ${pids[node-$i]}, log $dir/node-$i.log)"
done
for i in 1 2 3; do
	await_members "node-$i" "127.0.0.$i" "$api_port" "$dir/node-$i.log"
done
echo "cluster up: redis on 127.0.0.1:$redis_port (pid ${pids[redis]}); status: curl -s 127.0.0.1:$api_port/cluster; logs in $dir; Ctrl-C stops the cluster"

# Say when something dies; carry on while any node runs.
while :; do
	for name in "${!pids[@]}"; do
		pid=${pids[$name]}
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"
			status=$?
			unset "pids[$name]"
			log=$dir/$name.log
			say "$name (pid $pid) exited with status $status; its log ($log) ends:"
			tail_of "$log"
		fi
	done
	running=0
	for name in "${!pids[@]}"; do [[ $name == node-* ]] && running=$((running + 1)); done
	if [ $running -eq 0 ]; then
		die "no node is running any more"
	fi
	sleep 0.5
done
