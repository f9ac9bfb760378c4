package space

// JetStream API, KV and system subjects the profiles grant. Each builder validates the stream and
// consumer names it is given ([A-Za-z0-9_-], see validateJSName), so a name can never add a token
// or a wildcard; the '>' forms say so in their names (Any) and doc comments.

// Fixed subjects.
import "strings"

const (
	// JSAPIInfo is the account-info request every JetStream client sends first.
	JSAPIInfo = "$JS.API.INFO"
	// JSFlowControl covers flow-control replies of ordered (KV watch) consumers.
	JSFlowControl = "$JS.FC.>"
	// AuthCalloutSubject is where the server sends auth-callout requests.
	AuthCalloutSubject = "$SYS.REQ.USER.AUTH"
	// AccountConnzPing is the account-scoped CONNZ request: the broker imports it into every
	// account it tracks, maps it to $SYS.REQ.ACCOUNT.<account>.CONNZ, and every server of the
	// cluster answers with the requester's own account's connections only (nats-server
	// events.go, accPingReqSubj). authd's plane reclaim sweeps with it.
	AccountConnzPing = "$SYS.REQ.ACCOUNT.PING.CONNZ"
	// All matches every subject.
	All = ">"
	// JSConsumerAPI is every consumer verb of the JetStream API, on every stream.
	JSConsumerAPI = "$JS.API.CONSUMER.>"
	// JSAckAll is every ack subject of every consumer.
	JSAckAll = "$JS.ACK.>"
)

const jsAPI = "$JS.API."

func stream1(verb, stream string) (string, error) { return stream1Tail(verb, stream, "") }

// stream1Tail is $JS.API.<verb>.<stream><tail>, built in one concatenation (these subjects are
// built per minted credential).
func stream1Tail(verb, stream, tail string) (string, error) {
	if err := validateJSName(KindStream, stream); err != nil {
		return "", err
	}
	return jsAPI + verb + "." + stream + tail, nil
}

func stream2(verb, stream, consumer string) (string, error) {
	return stream2Tail(verb, stream, consumer, "")
}

// stream2Tail is $JS.API.<verb>.<stream>.<consumer><tail>, checked in that order.
func stream2Tail(verb, stream, consumer, tail string) (string, error) {
	if err := validateJSName(KindStream, stream); err != nil {
		return "", err
	}
	if err := validateJSName(KindConsumer, consumer); err != nil {
		return "", err
	}
	return jsAPI + verb + "." + stream + "." + consumer + tail, nil
}

// StreamInfo is $JS.API.STREAM.INFO.<stream> (also what a KV bind sends).
func StreamInfo(stream string) (string, error) { return stream1("STREAM.INFO", stream) }

// StreamCreate is $JS.API.STREAM.CREATE.<stream> (also create-if-matching for KV buckets).
func StreamCreate(stream string) (string, error) { return stream1("STREAM.CREATE", stream) }

// StreamUpdate is $JS.API.STREAM.UPDATE.<stream>.
func StreamUpdate(stream string) (string, error) { return stream1("STREAM.UPDATE", stream) }

// StreamMsgGet is $JS.API.STREAM.MSG.GET.<stream>, the leader-served read; the requested key or
// sequence rides the payload, so the grant is stream-wide.
func StreamMsgGet(stream string) (string, error) { return stream1("STREAM.MSG.GET", stream) }

// DirectGet is the bare $JS.API.DIRECT.GET.<stream>, the direct read whose request (sequence,
// next_by_subj filter, batch) rides the payload; like StreamMsgGet it reaches the whole stream.
func DirectGet(stream string) (string, error) { return stream1("DIRECT.GET", stream) }

// DirectGetAny is $JS.API.DIRECT.GET.<stream>.>, the direct read the Go KV client uses on
// allow_direct buckets; like StreamMsgGet it reaches every key of the stream.
func DirectGetAny(stream string) (string, error) { return stream1Tail("DIRECT.GET", stream, ".>") }

// DirectGetSubject is $JS.API.DIRECT.GET.<stream>.<subject>, the direct read of the last message
// on one concrete subject (a KV key's $KV.<bucket>.<key>): unlike DirectGetAny, the subject in
// the API subject pins what may be read. It refuses a subject with a wildcard or an empty token.
func DirectGetSubject(stream, subject string) (string, error) {
	if err := validateJSName(KindStream, stream); err != nil {
		return "", err
	}
	if subject == "" || strings.ContainsAny(subject, "*> \t\r\n") || strings.Contains(subject, "..") ||
		strings.HasPrefix(subject, ".") || strings.HasSuffix(subject, ".") {
		return "", nameErr(KindFilter, subject, "must be one concrete subject")
	}
	return jsAPI + "DIRECT.GET." + stream + "." + subject, nil
}

// ConsumerCreate is the bare $JS.API.CONSUMER.CREATE.<stream>, used by creates whose filter can
// not ride the subject (several filters, or an unnamed ephemeral).
func ConsumerCreate(stream string) (string, error) { return stream1("CONSUMER.CREATE", stream) }

// ConsumerCreateAny is $JS.API.CONSUMER.CREATE.<stream>.>: any named consumer, any filter.
func ConsumerCreateAny(stream string) (string, error) {
	return stream1Tail("CONSUMER.CREATE", stream, ".>")
}

// ConsumerCreateNamed is $JS.API.CONSUMER.CREATE.<stream>.<consumer>.>: one consumer name, any
// filter.
func ConsumerCreateNamed(stream, consumer string) (string, error) {
	return stream2Tail("CONSUMER.CREATE", stream, consumer, ".>")
}

// ConsumerCreateFiltered is $JS.API.CONSUMER.CREATE.<stream>.<consumer>.<filter>. The server
// refuses a create whose body filter differs from the subject's, so the grant pins both the name
// and the filter. The filter must pass ValidateFilter; its wildcards are the caller's.
func ConsumerCreateFiltered(stream, consumer, filter string) (string, error) {
	if err := validateJSName(KindStream, stream); err != nil {
		return "", err
	}
	if err := validateJSName(KindConsumer, consumer); err != nil {
		return "", err
	}
	if err := ValidateFilter(filter); err != nil {
		return "", err
	}
	return jsAPI + "CONSUMER.CREATE." + stream + "." + consumer + "." + filter, nil
}

// DurableCreate is the legacy $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<consumer>.
func DurableCreate(stream, consumer string) (string, error) {
	return stream2("CONSUMER.DURABLE.CREATE", stream, consumer)
}

// DurableCreateAny is $JS.API.CONSUMER.DURABLE.CREATE.<stream>.>.
func DurableCreateAny(stream string) (string, error) {
	return stream1Tail("CONSUMER.DURABLE.CREATE", stream, ".>")
}

// ConsumerInfo is $JS.API.CONSUMER.INFO.<stream>.<consumer>.
func ConsumerInfo(stream, consumer string) (string, error) {
	return stream2("CONSUMER.INFO", stream, consumer)
}

// ConsumerInfoAny is $JS.API.CONSUMER.INFO.<stream>.>.
func ConsumerInfoAny(stream string) (string, error) { return anyTail("CONSUMER.INFO", stream) }

// ConsumerNext is $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> (pull fetch).
func ConsumerNext(stream, consumer string) (string, error) {
	return stream2("CONSUMER.MSG.NEXT", stream, consumer)
}

// ConsumerNextAny is $JS.API.CONSUMER.MSG.NEXT.<stream>.>.
func ConsumerNextAny(stream string) (string, error) { return anyTail("CONSUMER.MSG.NEXT", stream) }

// ConsumerDelete is $JS.API.CONSUMER.DELETE.<stream>.<consumer>.
func ConsumerDelete(stream, consumer string) (string, error) {
	return stream2("CONSUMER.DELETE", stream, consumer)
}

// ConsumerDeleteAny is $JS.API.CONSUMER.DELETE.<stream>.>.
func ConsumerDeleteAny(stream string) (string, error) { return anyTail("CONSUMER.DELETE", stream) }

func anyTail(verb, stream string) (string, error) { return stream1Tail(verb, stream, ".>") }

// Ack is $JS.ACK.<stream>.<consumer>.>, the ack subjects of one consumer's deliveries.
func Ack(stream, consumer string) (string, error) {
	if err := validateJSName(KindStream, stream); err != nil {
		return "", err
	}
	if err := validateJSName(KindConsumer, consumer); err != nil {
		return "", err
	}
	return "$JS.ACK." + stream + "." + consumer + ".>", nil
}

// AckAny is $JS.ACK.<stream>.>, the ack subjects of every consumer on a stream.
func AckAny(stream string) (string, error) {
	if err := validateJSName(KindStream, stream); err != nil {
		return "", err
	}
	return "$JS.ACK." + stream + ".>", nil
}

// InboxPrefix is a connection's private reply-inbox prefix _INBOX_<token>. The token is the
// connection's user nkey on the static path or a client-chosen nonce on the auth-callout path;
// either must pass ValidateInboxNonce. Clients connect with this as their custom inbox prefix.
func InboxPrefix(token string) (string, error) {
	if err := ValidateInboxNonce(token); err != nil {
		return "", err
	}
	return "_INBOX_" + token, nil
}

// InboxFilter is the subscribe grant for a private inbox: _INBOX_<token>.>.
func InboxFilter(token string) (string, error) {
	p, err := InboxPrefix(token)
	if err != nil {
		return "", err
	}
	return p + ".>", nil
}

// System-account ($SYS) subjects of the delivery daemon's membership observer and connection
// evictor. Each builder takes the space's data account public key and refuses anything else, so
// an account can never add a token or a wildcard.

// SysKickAny is the kick request of every server: $SYS.REQ.SERVER.*.KICK. The server's API names
// a server, never an account.
const SysKickAny = "$SYS.REQ.SERVER.*.KICK"

// SysKick is the kick request of one server: $SYS.REQ.SERVER.<id>.KICK. A server id is a server
// public nkey (N…); anything else is refused.
func SysKick(serverID string) (string, error) {
	if !validSysToken(serverID) || !strings.HasPrefix(serverID, "N") {
		return "", &NameError{Kind: "server id", Value: serverID, Reason: "is not a server public key"}
	}
	return "$SYS.REQ.SERVER." + serverID + ".KICK", nil
}

// SysAccountConnz is the account-scoped connection list request: $SYS.REQ.ACCOUNT.<acct>.CONNZ.
func SysAccountConnz(account string) (string, error) {
	return sysAccount("$SYS.REQ.ACCOUNT.", account, ".CONNZ")
}

// SysAccountConnect is the account's connect event subject: $SYS.ACCOUNT.<acct>.CONNECT.
func SysAccountConnect(account string) (string, error) {
	return sysAccount("$SYS.ACCOUNT.", account, ".CONNECT")
}

// SysAccountDisconnect is the account's disconnect event subject: $SYS.ACCOUNT.<acct>.DISCONNECT.
func SysAccountDisconnect(account string) (string, error) {
	return sysAccount("$SYS.ACCOUNT.", account, ".DISCONNECT")
}

func sysAccount(prefix, account, suffix string) (string, error) {
	if !validSysToken(account) || !strings.HasPrefix(account, "A") || len(account) != 56 {
		return "", &NameError{Kind: "account", Value: account, Reason: "is not an account public key"}
	}
	return prefix + account + suffix, nil
}

// validSysToken accepts the base32 alphabet of an nkey public key and nothing else.
func validSysToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}
