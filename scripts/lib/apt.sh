# Shared by scripts/install-build-deps and scripts/install-test-deps (sourced; they define
# `say` and `die`).
#
# apt-get update, waiting (up to 10 minutes) while another apt or dpkg holds the package
# lists' lock — unattended upgrades on a fresh machine, or another of these scripts —
# instead of failing at once. `apt-get update` does not wait by itself (`apt-get install`
# does, given `-o DPkg::Lock::Timeout=600`). Arguments: a command prefix such as `sudo`.
apt_update() {
    local err attempt
    err=$(mktemp)
    for attempt in $(seq 1 120); do
        if "$@" apt-get update -qq 2>"$err"; then
            rm -f "$err"
            return 0
        fi
        if ! grep -q "Could not get lock" "$err"; then
            cat "$err" >&2
            rm -f "$err"
            die "apt-get update failed"
        fi
        [[ $attempt -eq 1 ]] && say "waiting for another apt/dpkg to release its lock"
        sleep 5
    done
    rm -f "$err"
    die "apt-get update: the package lists stayed locked by another process for 10 minutes"
}
