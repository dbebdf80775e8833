# Hosts of their own on one machine, for tests and benchmarks (needs root): network
# namespaces PREFIX-NODE, each with an "eth0" holding ${IP[NODE]}/24, joined by veth pairs
# ("v-NODE" on the switch side) to a bridge in a "switch" namespace PREFIX-sw of its own;
# nothing is added to the machine's own network.
#
#   declare -A IP=([a]=10.77.0.11 ...); created=(); pids=()
#   netns_switch PREFIX || { echo "cannot: $NETNS_ERROR"; ...; }
#   netns_host PREFIX NODE        (once per node)
#   trap netns_cleanup EXIT       (kills $pids and whatever runs in the namespaces, deletes them)

# Creates the switch namespace and its bridge; on failure sets NETNS_ERROR and returns 1.
netns_switch() {
  local sw="$1-sw"
  command -v ip >/dev/null || { NETNS_ERROR="no ip command (apt-get install iproute2)"; return 1; }
  NETNS_ERROR=$(ip netns add "$sw" 2>&1) || return 1
  created+=("$sw")
  ip -n "$sw" link set lo up
  ip -n "$sw" link add name br0 type bridge
  ip -n "$sw" link set br0 up
}

netns_host() {
  local p=$1 n=$2
  ip netns add "$p-$n"
  created+=("$p-$n")
  ip -n "$p-sw" link add name "v-$n" type veth peer name eth0 netns "$p-$n"
  ip -n "$p-sw" link set "v-$n" master br0 up
  ip -n "$p-$n" addr add "${IP[$n]}/24" dev eth0
  ip -n "$p-$n" link set eth0 up
  ip -n "$p-$n" link set lo up
}

netns_cleanup() {
  local ns pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # Anything else still running inside our namespaces (only our own processes can be there).
  for ns in "${created[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for ns in "${created[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
