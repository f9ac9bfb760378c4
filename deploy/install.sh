#!/usr/bin/env bash
# deploy/install.sh: install Cotal's daemons on one server, each under its own uid.
#
#   deploy/install.sh [--destdir DIR] [--bin-dir DIR] [--space NAME]... [--no-systemctl]
#
# Root only. Idempotent: a second run with the same arguments changes nothing (files are
# written only when absent or different; keys and certificates only when absent; a config you
# edited is never overwritten). It installs the binaries, the users (systemd-sysusers, or
# useradd), the directories, the systemd units, example configs and the signerd policy; it runs
# `signerd init` and `signerd pki init` only if no keys exist (and `signerd init --add-space`
# for a --space not yet initialised); it puts the signing material in signerd's directory only
# and authd's callout seed in authd's; then it prints the next steps. It enables and starts
# nothing. --destdir installs under DIR instead of / (the users go into DIR/etc/passwd, owners
# are set by number, systemctl is not run): the tests use it.
#
# Layout (docs/deploying.md's "Layout on the server" has the same table, and deploy_test.go checks
# that this copy matches it and that an install matches both). <tok> is a space's token
# (pkg/space.Token: the name with each character outside [A-Za-z0-9_-] mapped to '_'), which is
# also the systemd instance name; <seg> is space.<hex of the name>. Owners and modes are exact.
#
# /usr/local/bin                                                root:root                      0755
# /usr/local/bin/signerd                                        root:root                      0755  binary
# /usr/local/bin/authd                                          root:root                      0755  binary
# /usr/local/bin/deliveryd                                      root:root                      0755  binary
# /usr/local/bin/managerd                                       root:root                      0755  binary (serve, launcher, provision)
# /etc/sysusers.d/cotal.conf                                    root:root                      0644  the four users
# /etc/tmpfiles.d/cotal.conf                                    root:root                      0644  the fixed directories
# /etc/systemd/system/cotal-signerd.service                     root:root                      0644  unit
# /etc/systemd/system/cotal-authd@.service                      root:root                      0644  unit
# /etc/systemd/system/cotal-deliveryd@.service                  root:root                      0644  unit
# /etc/systemd/system/cotal-launcher@.service                   root:root                      0644  unit
# /etc/systemd/system/cotal-managerd@.service                   root:root                      0644  unit
# /etc/systemd/system/cotal-signerd.service.d                   root:root                      0755  drop-in directory
# /etc/systemd/system/cotal-signerd.service.d/credentials.conf  root:root                      0644  LoadCredential=<seg>.<file>:... for every seed file of every space
# /etc/cotal                                                    root:root                      0755  configuration
# /etc/cotal/signerd                                            root:cotal-signer              0750
# /etc/cotal/signerd/signerd.yaml                               root:cotal-signer              0640  signerd's config
# /etc/cotal/signerd/policy.yaml                                root:cotal-signer              0640  who may mint what (reloaded on change)
# /etc/cotal/signerd/signerd.pem                                root:root                      0644  signerd's server certificate
# /etc/cotal/signerd/client-ca.pem                              root:root                      0644  the CA of the callers' client certificates
# /etc/cotal/authd                                              root:cotal-auth                0750
# /etc/cotal/authd/<tok>.yaml                                   root:cotal-auth                0640  authd's config for the space
# /etc/cotal/authd/<tok>.pem                                    root:root                      0644  client certificate spiffe://cotal.local/authd/<tok>
# /etc/cotal/authd/signerd-ca.pem                               root:root                      0644  the CA that signed signerd's certificate
# /etc/cotal/deliveryd                                          root:cotal-delivery            0750
# /etc/cotal/deliveryd/<tok>.yaml                               root:cotal-delivery            0640  deliveryd's config
# /etc/cotal/deliveryd/<tok>.pem                                root:root                      0644  client certificate spiffe://cotal.local/deliveryd/<tok>
# /etc/cotal/deliveryd/signerd-ca.pem                           root:root                      0644  signerd's CA
# /etc/cotal/managerd                                           root:cotal-manager             0750
# /etc/cotal/managerd/<tok>.yaml                                root:cotal-manager             0640  managerd's config (instance_id generated once)
# /etc/cotal/managerd/<tok>.provision.yaml                      root:cotal-manager             0640  managerd provision's config (reads the key file directly)
# /etc/cotal/managerd/<tok>.pem                                 root:root                      0644  client certificate spiffe://cotal.local/managerd/<tok>
# /etc/cotal/managerd/signerd-ca.pem                            root:root                      0644  signerd's CA
# /etc/cotal/launcher                                           root:root                      0750
# /etc/cotal/launcher/<tok>.yaml                                root:root                      0640  the launcher's config, with this machine's uid of cotal-manager and the space's agent uid range
# /etc/cotal/broker                                             root:root                      0755
# /etc/cotal/broker/nats.conf                                   root:root                      0644  nats-server trust: operator JWT, account JWTs; no seed; JetStream in /var/lib/nats/jetstream
# /var/lib/cotal                                                root:root                      0755  state
# /var/lib/cotal/pki                                            root:root                      0700  the dev CA from signerd pki init (absent if you bring your own CA)
# /var/lib/cotal/pki/ca.key                                     root:root                      0600  the dev CA's key
# /var/lib/cotal/pki/ca.pem                                     root:root                      0644  the dev CA
# /var/lib/cotal/pki/signerd.pem                                root:root                      0644  as issued (copied to /etc/cotal/signerd)
# /var/lib/cotal/pki/signerd.key                                root:root                      0600  as issued (copied to signerd's tls/)
# /var/lib/cotal/pki/clients                                    root:root                      0700
# /var/lib/cotal/pki/clients/*.pem                              root:root                      0644  as issued, <daemon>-<tok>.pem
# /var/lib/cotal/pki/clients/*.key                              root:root                      0600  as issued, <daemon>-<tok>.key
# /var/lib/cotal/signerd                                        cotal-signer:cotal-signer      0700  signerd's home and signerd init --dir
# /var/lib/cotal/signerd/operator                               cotal-signer:cotal-signer      0700  operator and account identity seeds: move off the machine
# /var/lib/cotal/signerd/operator/*.nk                          cotal-signer:cotal-signer      0600  operator identity and signing seeds, system account seed
# /var/lib/cotal/signerd/operator/<seg>                         cotal-signer:cotal-signer      0700
# /var/lib/cotal/signerd/operator/<seg>/*.nk                    cotal-signer:cotal-signer      0600  the space's data and callout account identity seeds
# /var/lib/cotal/signerd/signer                                 cotal-signer:cotal-signer      0700  signerd's key directory (key_dir)
# /var/lib/cotal/signerd/signer/<seg>                           cotal-signer:cotal-signer      0700
# /var/lib/cotal/signerd/signer/<seg>/*                         cotal-signer:cotal-signer      0600  data-signing.nk, auth-signing.nk, xkey.nk, issuer.key, owner-secret, mac.key
# /var/lib/cotal/signerd/signer/system-signing.nk                cotal-signer:cotal-signer      0600  the system account's signing seed (deliveryd's $SYS users)
# /var/lib/cotal/signerd/public                                 cotal-signer:cotal-signer      0755  public_dir
# /var/lib/cotal/signerd/public/*.json                          cotal-signer:cotal-signer      0644  broker.json, <seg>.json: JWTs and public keys
# /var/lib/cotal/signerd/broker                                 cotal-signer:cotal-signer      0755
# /var/lib/cotal/signerd/broker/nats.conf                       cotal-signer:cotal-signer      0644  as signerd init renders it (source of /etc/cotal/broker/nats.conf)
# /var/lib/cotal/signerd/tls                                    cotal-signer:cotal-signer      0700
# /var/lib/cotal/signerd/tls/signerd.key                        cotal-signer:cotal-signer      0600  signerd's TLS key (LoadCredential signerd.key)
# /var/lib/cotal/signerd/audit                                  cotal-signer:cotal-signer      0700  the audit log signerd.audit
# /var/lib/cotal/authd                                          cotal-auth:cotal-auth          0700
# /var/lib/cotal/authd/<tok>                                    cotal-auth:cotal-auth          0700
# /var/lib/cotal/authd/<tok>/callout.nk                         cotal-auth:cotal-auth          0600  the callout service's user seed (SU…), the only seed outside signerd's directory (LoadCredential callout.nk)
# /var/lib/cotal/authd/<tok>/client.key                         cotal-auth:cotal-auth          0600  authd's client key for signerd (LoadCredential client.key)
# /var/lib/cotal/authd/<tok>/state                              cotal-auth:cotal-auth          0700  state_dir: discovery and refusal files, IdP pin, actor ledger
# /var/lib/cotal/deliveryd                                      cotal-delivery:cotal-delivery  0700
# /var/lib/cotal/deliveryd/<tok>                                cotal-delivery:cotal-delivery  0700
# /var/lib/cotal/deliveryd/<tok>/client.key                     cotal-delivery:cotal-delivery  0600  deliveryd's client key (LoadCredential client.key)
# /var/lib/cotal/deliveryd/<tok>/state                          cotal-delivery:cotal-delivery  0700  state_dir: refusal file
# /var/lib/cotal/managerd                                       cotal-manager:cotal-manager    0700
# /var/lib/cotal/managerd/<tok>                                 cotal-manager:cotal-manager    0700
# /var/lib/cotal/managerd/<tok>/client.key                      cotal-manager:cotal-manager    0600  managerd's client key (LoadCredential client.key)
# /var/lib/cotal/managerd/<tok>/state                           cotal-manager:cotal-manager    0700  state_dir: custody records of its agents
# /var/lib/cotal/agents                                         root:root                      0755  parent of the launchers' agent roots
# /run/cotal                                                    root:root                      0755  parents of the sockets (tmpfiles.d recreates them at boot)
# /run/cotal/launcher                                           root:root                      0755
# /run/cotal/managerd                                           root:root                      0755
# /run/cotal/manager                                            root:root                      0755
#
# Made at run time, not here: /run/credentials/<unit>/ (systemd LoadCredential=, the unit's
# user, dir 0500, files 0400); /var/lib/cotal/agents/<tok> (root 0755) and <tok>/<agent>
# (<the agent's uid>:cotal-manager 0750) by the launcher; /run/cotal/launcher/<tok>/launcher.sock
# (root:cotal-manager, dir 0750, socket 0660) and /run/cotal/managerd/<tok>/launcher.token
# (cotal-manager, dir 0700, file 0600) by the launcher; /run/cotal/manager/<tok>/manager.sock
# (cotal-manager, dir 0750, socket 0660) by managerd.
set -euo pipefail
umask 022

usage() {
	sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
}

die() { echo "install.sh: $*" >&2; exit 1; }

DEST="${DESTDIR:-}"
BIN_DIR=""
SPACES=()
SYSTEMCTL=1
while [ $# -gt 0 ]; do
	case "$1" in
	--destdir) [ $# -ge 2 ] || die "--destdir needs a directory"; DEST="$2"; shift 2 ;;
	--destdir=*) DEST="${1#*=}"; shift ;;
	--bin-dir) [ $# -ge 2 ] || die "--bin-dir needs a directory"; BIN_DIR="$2"; shift 2 ;;
	--bin-dir=*) BIN_DIR="${1#*=}"; shift ;;
	--space) [ $# -ge 2 ] || die "--space needs a name"; SPACES+=("$2"); shift 2 ;;
	--space=*) SPACES+=("${1#*=}"); shift ;;
	--no-systemctl) SYSTEMCTL=0; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown argument: $1" ;;
	esac
done

[ "$(id -u)" = 0 ] || die "must run as root (it creates users and sets owners); refusing"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "$DEST" ]; then
	mkdir -p "$DEST"
	DEST="$(cd "$DEST" && pwd)"
	[ "$DEST" = / ] && DEST=""
fi
[ -n "$DEST" ] && SYSTEMCTL=0
R="$DEST" # prefix every path on the target with $R

# --- binaries ---------------------------------------------------------------------------------
BINS=(signerd authd deliveryd managerd)
if [ -z "$BIN_DIR" ]; then
	BIN_DIR="$REPO/bin"
	for b in "${BINS[@]}"; do
		if [ ! -x "$BIN_DIR/$b" ]; then
			echo "building the binaries (make build)"
			make -C "$REPO" build >/dev/null
			break
		fi
	done
fi
for b in "${BINS[@]}"; do
	[ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b: missing or not executable"
done
SIGNERD="$BIN_DIR/signerd"

# put SRC DST MODE OWNER GROUP: install SRC as DST unless DST already has that content; set the
# owner and mode either way (numeric ids, so a --destdir root's users work).
put() {
	local src="$1" dst="$2" mode="$3" uid="$4" gid="$5"
	if [ ! -f "$dst" ] || ! cmp -s "$src" "$dst"; then
		install -m "$mode" -o "$uid" -g "$gid" "$src" "$dst"
		echo "  wrote $dst"
	elif [ "$(stat -c '%04a %u %g' "$dst")" != "$mode $uid $gid" ]; then
		chown "$uid:$gid" "$dst"
		chmod "$mode" "$dst"
	fi
}

# putnew SRC DST MODE OWNER GROUP: like put, but never replaces an existing DST (configs the
# administrator may have edited, keys and certificates).
putnew() {
	local src="$1" dst="$2" mode="$3" uid="$4" gid="$5"
	if [ ! -e "$dst" ]; then
		install -m "$mode" -o "$uid" -g "$gid" "$src" "$dst"
		echo "  wrote $dst"
	fi
}

# dir PATH MODE OWNER GROUP: make PATH if missing and set exactly this owner and mode (install
# -d does both for an existing directory too, and leaves its contents and mtime alone).
dir() {
	install -d -m "$2" -o "$3" -g "$4" "$1"
}

echo "binaries -> $R/usr/local/bin"
dir "$R/usr/local/bin" 0755 0 0
for b in "${BINS[@]}"; do put "$BIN_DIR/$b" "$R/usr/local/bin/$b" 0755 0 0; done

# --- users ------------------------------------------------------------------------------------
echo "users"
dir "$R/etc" 0755 0 0
for d in sysusers.d tmpfiles.d; do
	dir "$R/etc/$d" 0755 0 0
	put "$REPO/deploy/$d/cotal.conf" "$R/etc/$d/cotal.conf" 0644 0 0
done
USERS=(cotal-signer cotal-auth cotal-delivery cotal-manager)
if command -v systemd-sysusers >/dev/null 2>&1; then
	for f in passwd group; do [ -e "$R/etc/$f" ] || : >"$R/etc/$f"; done
	systemd-sysusers ${R:+--root="$R"} "$R/etc/sysusers.d/cotal.conf" >/dev/null
else
	while read -r name home; do
		if ! grep -q "^$name:" "$R/etc/passwd" 2>/dev/null; then
			useradd ${R:+--prefix "$R"} --system --user-group --no-create-home \
				--home-dir "$home" --shell /usr/sbin/nologin "$name"
		fi
	done < <(awk '$1 == "u" { print $2, $NF }' "$R/etc/sysusers.d/cotal.conf")
fi
declare -A UID_OF GID_OF
while IFS=: read -r n _ id _; do UID_OF[$n]="$id"; done <"$R/etc/passwd"
while IFS=: read -r n _ id _; do GID_OF[$n]="$id"; done <"$R/etc/group"
UID_OF[root]=0
GID_OF[root]=0
for u in "${USERS[@]}"; do
	[ -n "${UID_OF[$u]:-}" ] || die "no user $u in $R/etc/passwd"
	[ -n "${GID_OF[$u]:-}" ] || die "no group $u in $R/etc/group"
done

# --- fixed directories (the tmpfiles.d lines, applied here) -------------------------------------
echo "directories"
while read -r type path mode user group _; do
	[ "$type" = d ] || continue
	dir "$R$path" "$mode" "${UID_OF[$user]}" "${GID_OF[$group]}"
done < <(grep -v '^#' "$REPO/deploy/tmpfiles.d/cotal.conf")

SU="${UID_OF[cotal-signer]}"
SG="${GID_OF[cotal-signer]}"
SDIR="$R/var/lib/cotal/signerd"

# --- keys: signerd init, once; --add-space for a new space -------------------------------------
hex_of() { printf '%s' "$1" | od -An -tx1 -v | tr -d ' \n'; }
name_of_seg() { printf '%b' "$(printf '%s' "${1#space.}" | sed 's/../\\x&/g')"; }

# as_signer ARGS...: the installed signerd, run as cotal-signer (init refuses key directories
# owned by another uid, and what it writes is born cotal-signer's with init's own modes).
as_signer() {
	setpriv --reuid="$SU" --regid="$SG" --clear-groups -- "$R/usr/local/bin/signerd" "$@"
}

if [ ! -d "$SDIR/operator" ]; then
	[ "${#SPACES[@]}" -gt 0 ] || die "no keys yet: name at least one --space for signerd init"
	echo "signerd init (spaces: ${SPACES[*]})"
	args=()
	for s in "${SPACES[@]}"; do args+=(--space "$s"); done
	as_signer init --dir "$SDIR" "${args[@]}" >/dev/null
else
	for s in "${SPACES[@]}"; do
		if [ ! -f "$SDIR/public/space.$(hex_of "$s").json" ]; then
			echo "signerd init --add-space $s"
			as_signer init --dir "$SDIR" --add-space --space "$s" >/dev/null
		fi
	done
fi

# Every initialised space, by its public facts.
SEGS=()
for f in "$SDIR"/public/space.*.json; do
	[ -e "$f" ] || continue
	b="$(basename "$f" .json)"
	SEGS+=("$b")
done
[ "${#SEGS[@]}" -gt 0 ] || die "no space facts in $SDIR/public"
declare -A TOK_OF NAME_OF
for seg in "${SEGS[@]}"; do
	TOK_OF[$seg]="$(sed -n 's/.*"token": *"\([A-Za-z0-9_-]*\)".*/\1/p' "$SDIR/public/$seg.json" | head -n 1)"
	[ -n "${TOK_OF[$seg]}" ] || die "$SDIR/public/$seg.json: no token"
	NAME_OF[$seg]="$(name_of_seg "$seg")"
done

# --- per-space state directories and authd's callout seed ---------------------------------------
echo "per-space directories"
for seg in "${SEGS[@]}"; do
	tok="${TOK_OF[$seg]}"
	for pair in authd:cotal-auth deliveryd:cotal-delivery managerd:cotal-manager; do
		d="${pair%%:*}" u="${pair#*:}"
		dir "$R/var/lib/cotal/$d/$tok" 0700 "${UID_OF[$u]}" "${GID_OF[$u]}"
		dir "$R/var/lib/cotal/$d/$tok/state" 0700 "${UID_OF[$u]}" "${GID_OF[$u]}"
	done
	# The callout user seed is authd's: move it out of signerd's directory.
	src="$SDIR/authd/$seg/callout.nk"
	dst="$R/var/lib/cotal/authd/$tok/callout.nk"
	if [ -f "$src" ]; then
		[ -e "$dst" ] && die "$dst exists and init wrote a new $src; move one of them away"
		install -m 0600 -o "${UID_OF[cotal-auth]}" -g "${GID_OF[cotal-auth]}" "$src" "$dst"
		rm -f "$src"
		rmdir "$SDIR/authd/$seg"
		echo "  moved the callout seed of $tok to $dst"
	fi
done
[ -d "$SDIR/authd" ] && rmdir "$SDIR/authd" 2>/dev/null || true

# --- PKI: a dev CA once, unless certificates are already in place ---------------------------------
PKI="$R/var/lib/cotal/pki"
if [ ! -f "$PKI/ca.pem" ] && [ ! -f "$R/etc/cotal/signerd/client-ca.pem" ]; then
	echo "signerd pki init (a throwaway dev CA; see 'Bringing your own CA')"
	args=()
	for seg in "${SEGS[@]}"; do args+=(--space "${NAME_OF[$seg]}"); done
	"$SIGNERD" pki init --dir "$PKI" "${args[@]}" >/dev/null
fi
echo "certificates and keys"
if [ -f "$PKI/ca.pem" ]; then
	putnew "$PKI/signerd.pem" "$R/etc/cotal/signerd/signerd.pem" 0644 0 0
	putnew "$PKI/ca.pem" "$R/etc/cotal/signerd/client-ca.pem" 0644 0 0
	putnew "$PKI/signerd.key" "$SDIR/tls/signerd.key" 0600 "$SU" "$SG"
fi
MISSING=()
for seg in "${SEGS[@]}"; do
	tok="${TOK_OF[$seg]}"
	for pair in authd:cotal-auth deliveryd:cotal-delivery managerd:cotal-manager; do
		d="${pair%%:*}" u="${pair#*:}"
		if [ -f "$PKI/clients/$d-$tok.pem" ]; then
			putnew "$PKI/ca.pem" "$R/etc/cotal/$d/signerd-ca.pem" 0644 0 0
			putnew "$PKI/clients/$d-$tok.pem" "$R/etc/cotal/$d/$tok.pem" 0644 0 0
			putnew "$PKI/clients/$d-$tok.key" "$R/var/lib/cotal/$d/$tok/client.key" 0600 "${UID_OF[$u]}" "${GID_OF[$u]}"
		fi
		[ -f "$R/etc/cotal/$d/$tok.pem" ] && [ -f "$R/var/lib/cotal/$d/$tok/client.key" ] || MISSING+=("$d/$tok")
	done
done

# --- configs ------------------------------------------------------------------------------------
echo "configs"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# render TEMPLATE SPACE-NAME TOKEN: the template with its @...@ placeholders filled in. Bash's
# own substitution with quoted replacements, so a name's quotes, backslashes or '&' stay literal
# (awk's gsub would read them); the name goes in as a double-quoted YAML scalar.
shopt -u patsub_replacement 2>/dev/null || true
# Each space's launcher starts its agents as uids of a block of its own: AGENT_UID_COUNT uids
# from AGENT_UID_BASE + k * AGENT_UID_COUNT, the first block no launcher config already names.
# 70000-99999 is above systemd's ranges (homed, dynamic users end at 65519, nobody is 65534) and
# below /etc/subuid's first allocation (SUB_UID_MIN 100000); the launcher refuses a range any
# /etc/passwd or /etc/group entry holds.
AGENT_UID_BASE=70000
AGENT_UID_COUNT=1000
next_agent_uid_first() { # sets AGENT_UID_FIRST
	local k first used
	used="$(sed -n 's/^agents: *{uid_first: *\([0-9][0-9]*\).*/\1/p' "$R"/etc/cotal/launcher/*.yaml 2>/dev/null || true)"
	for ((k = 0; k < 30; k++)); do
		first=$((AGENT_UID_BASE + k * AGENT_UID_COUNT))
		grep -qx "$first" <<<"$used" || {
			AGENT_UID_FIRST="$first"
			return
		}
	done
	die "no free block of $AGENT_UID_COUNT agent uids left in $AGENT_UID_BASE-99999 (30 spaces)"
}
render() {
	local name="$2" tok="$3" q c inst t
	q="${name//\\/\\\\}"
	q="\"${q//\"/\\\"}\""
	c="$(printf '%s' "$name" | tr -c 'A-Za-z0-9 _.-' '?')"
	inst="$(od -An -N13 -tx1 /dev/urandom | tr -d ' \n')"
	t="$(<"$1")"
	t="${t//@SPACE_YAML@/"$q"}"
	t="${t//@SPACE_COMMENT@/"$c"}"
	t="${t//@TOKEN@/"$tok"}"
	t="${t//@INSTANCE_ID@/"$inst"}"
	t="${t//@MANAGER_UID@/"${UID_OF[cotal-manager]}"}"
	t="${t//@MANAGER_GID@/"${GID_OF[cotal-manager]}"}"
	if [[ "$t" == *@AGENT_UID_FIRST@* ]]; then
		next_agent_uid_first
		t="${t//@AGENT_UID_FIRST@/"$AGENT_UID_FIRST"}"
		t="${t//@AGENT_UID_COUNT@/"$AGENT_UID_COUNT"}"
	fi
	printf '%s\n' "$t"
}
putnew "$REPO/deploy/etc/signerd/signerd.yaml" "$R/etc/cotal/signerd/signerd.yaml" 0640 0 "$SG"
putnew "$REPO/deploy/etc/signerd/policy.yaml" "$R/etc/cotal/signerd/policy.yaml" 0640 0 "$SG"
for seg in "${SEGS[@]}"; do
	tok="${TOK_OF[$seg]}"
	name="${NAME_OF[$seg]}"
	for spec in authd:space.yaml:"$tok.yaml":cotal-auth deliveryd:space.yaml:"$tok.yaml":cotal-delivery \
		managerd:space.yaml:"$tok.yaml":cotal-manager managerd:provision.yaml:"$tok.provision.yaml":cotal-manager \
		launcher:space.yaml:"$tok.yaml":root; do
		IFS=: read -r d tmpl out grp <<<"$spec"
		[ -e "$R/etc/cotal/$d/$out" ] && continue
		render "$REPO/deploy/etc/$d/$tmpl" "$name" "$tok" >"$TMP/cfg"
		putnew "$TMP/cfg" "$R/etc/cotal/$d/$out" 0640 0 "${GID_OF[$grp]}"
	done
done
# The broker's trust, public: follows signerd init (--add-space rewrites it). JetStream's store
# goes to /var/lib/nats, not under signerd's directory.
sed 's#^\( *store_dir: *\).*#\1"/var/lib/nats/jetstream"#' "$SDIR/broker/nats.conf" >"$TMP/nats.conf"
put "$TMP/nats.conf" "$R/etc/cotal/broker/nats.conf" 0644 0 0

# --- systemd units --------------------------------------------------------------------------------
echo "systemd units -> $R/etc/systemd/system"
dir "$R/etc/systemd" 0755 0 0
dir "$R/etc/systemd/system" 0755 0 0
for u in "$REPO"/deploy/systemd/*.service; do
	put "$u" "$R/etc/systemd/system/$(basename "$u")" 0644 0 0
done
# signerd's seeds: one LoadCredential= per file, named <seg>.<file> as signerd's keystore reads
# them from $CREDENTIALS_DIRECTORY.
{
	echo "# Written by deploy/install.sh from /var/lib/cotal/signerd/signer: one credential per seed"
	echo "# file of every space (signerd reads them as \$CREDENTIALS_DIRECTORY/<seg>.<file>)."
	echo "# Re-run install.sh after adding a space."
	echo "[Service]"
	for seg in "${SEGS[@]}"; do
		for f in data-signing.nk auth-signing.nk xkey.nk issuer.key owner-secret mac.key; do
			[ -f "$SDIR/signer/$seg/$f" ] || die "$SDIR/signer/$seg/$f: missing"
			echo "LoadCredential=$seg.$f:/var/lib/cotal/signerd/signer/$seg/$f"
		done
	done
	# The system account's signing seed (deliveryd's $SYS users), one per broker; a broker
	# initialised before it existed has none and signerd then mints no $SYS user.
	if [ -f "$SDIR/signer/system-signing.nk" ]; then
		echo "LoadCredential=system-signing.nk:/var/lib/cotal/signerd/signer/system-signing.nk"
	fi
} >"$TMP/credentials.conf"
dir "$R/etc/systemd/system/cotal-signerd.service.d" 0755 0 0
put "$TMP/credentials.conf" "$R/etc/systemd/system/cotal-signerd.service.d/credentials.conf" 0644 0 0

if [ "$SYSTEMCTL" = 1 ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
fi

# --- next steps -----------------------------------------------------------------------------------
cat <<EOF

Installed${R:+ under $R}. Next steps (docs/deploying.md "Deploying on a server"):
  1. Review /etc/cotal/managerd/<tok>.yaml (api.allow_uids) and /etc/cotal/launcher/<tok>.yaml
     (connectors), and the agent grants in /etc/cotal/signerd/policy.yaml.
  2. Run nats-server with /etc/cotal/broker/nats.conf (install.sh does not install it).
  3. Move /var/lib/cotal/signerd/operator off this machine (needed only for --add-space and rotation).
  4. systemctl enable --now cotal-signerd.service
  5. Per space: provision its streams and buckets once (authd and deliveryd refuse to start
     without them), then start its daemons:
EOF
for seg in "${SEGS[@]}"; do
	tok="${TOK_OF[$seg]}"
	cat <<EOF
     setpriv --reuid=cotal-manager --regid=cotal-manager --clear-groups \\
       /usr/local/bin/managerd provision --space $(printf '%q' "${NAME_OF[$seg]}") --config /etc/cotal/managerd/$tok.provision.yaml
     systemctl enable --now cotal-authd@$tok.service cotal-deliveryd@$tok.service cotal-launcher@$tok.service cotal-managerd@$tok.service
EOF
done
if [ "${#MISSING[@]}" -gt 0 ]; then
	echo "  Missing client certificates (issue them from your CA; see 'Bringing your own CA'): ${MISSING[*]}"
fi
