# Sourced by the launch scripts (bash): their shared argument checks. Each check prints one line
# naming what is wrong to stderr and exits 2, nsl's status for bad user input.

# need_args MIN USAGE "$@": fewer than MIN arguments -> "usage: USAGE".
need_args() {
  local min=$1 usage=$2
  shift 2
  if [ $# -lt "$min" ]; then
    echo "usage: $usage" >&2
    exit 2
  fi
}

# need_count NAME VALUE: VALUE must be a positive integer (a node or process count).
need_count() {
  case $2 in
    '' | *[!0-9]* | 0) echo "$0: $1 must be a positive integer, got '$2'" >&2; exit 2 ;;
  esac
}
