package leasehold

// The HTTP API's answers as this client reads them, beside Lock, Holder
// and Waiter, each named for its schema in the OpenAPI document
// (docs/openapi.yaml): a test checks that each field here is in its schema
// with the same JSON type, and that each field the schema requires is here.

// acquired is an acquire's grant (`Acquired`).
type acquired struct {
	Lease            uint64 `json:"lease"`
	Fence            uint64 `json:"fence"`
	CheckpointBase64 string `json:"checkpoint_base64,omitempty"`
}

// granted is a new lease (`Granted`).
type granted struct {
	Lease uint64 `json:"lease"`
	TTLMs uint64 `json:"ttl_ms"`
}

// renewed is a keepalive's answer.
type renewed struct {
	TTLMs    uint64  `json:"ttl_ms"`
	KeyCount *uint64 `json:"key_count,omitempty"` // nil from an older server: nothing to go by
}

// watchEvent is an event's data (`WatchEvent`).
type watchEvent struct {
	Kind       string `json:"kind"`
	Key        string `json:"key"`
	Fence      uint64 `json:"fence"`
	Lease      uint64 `json:"lease"`
	Holder     string `json:"holder"`
	Index      uint64 `json:"index"`
	Seq        uint32 `json:"seq"`
	AtUnixMs   uint64 `json:"at_unix_ms"`
	DataBase64 string `json:"data_base64,omitempty"`
}
