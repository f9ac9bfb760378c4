package managerauthority

// PrepareRetirementAnswer is the answer to a served manager-managed-agent-prepare-retirement
// (reference lifecycle-hosted.md §2.6): the request echoed with the owner the host derived, then
// prepared:true. Success means the target lifecycle's broker footprint is released (its ACL row
// fenced, its two exact durables, ACL row and membership rows removed) and its managed grant is
// revoked, so the manager's terminal rail finds the grant gone; the lifecycle head is untouched.
// Revoked says this call revoked the grant: false when the grant was already absent or at another
// uid (a repeat, a no-op). Cleanup is what this call's footprint removal observed, slot by slot
// (the seed's durable cleanup results); all zero on a no-op.
type PrepareRetirementAnswer struct {
	V          int     `json:"v"`
	Kind       string  `json:"kind"`
	Space      string  `json:"space"`
	Owner      string  `json:"owner"`
	Actor      string  `json:"actor"`
	InstanceID string  `json:"instanceId"`
	RequestID  string  `json:"requestId"`
	ServeEpoch uint64  `json:"serveEpoch"`
	Target     Target  `json:"target"`
	OpID       string  `json:"opId"`
	Prepared   bool    `json:"prepared"`
	Revoked    bool    `json:"revoked"`
	Cleanup    Cleanup `json:"cleanup"`
}

// Cleanup is one footprint removal's counts (pkg/provision.Result in the seed's names): the
// totals over every examined slot, and the consumer, ACL and membership subtotals. Deleted, in
// the totals and in Consumers, is null when a consumer disappeared without a winner token (who
// removed it is unknown). Members lists the channels whose membership rows were examined.
type Cleanup struct {
	Examined     int            `json:"examined"`
	Absent       int            `json:"absent"`
	Acknowledged int            `json:"acknowledged"`
	Deleted      *int           `json:"deleted"`
	Disappeared  int            `json:"disappeared"`
	Refused      int            `json:"refused"`
	Consumers    ConsumerCounts `json:"consumers"`
	ACL          KVCounts       `json:"acl"`
	Members      KVCounts       `json:"members"`
	Channels     []string       `json:"memberChannels"`
}

// ConsumerCounts are the two exact consumers' outcomes.
type ConsumerCounts struct {
	Examined     int  `json:"examined"`
	Absent       int  `json:"absent"`
	Acknowledged int  `json:"acknowledged"`
	Deleted      *int `json:"deleted"`
	Disappeared  int  `json:"disappeared"`
	Refused      int  `json:"refused"`
}

// KVCounts are one bucket's key outcomes.
type KVCounts struct {
	Examined    int `json:"examined"`
	Absent      int `json:"absent"`
	Deleted     int `json:"deleted"`
	Disappeared int `json:"disappeared"`
	Refused     int `json:"refused"`
}
