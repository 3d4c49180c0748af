module github.com/policyd/policyd/clients/go/policyclient

go 1.26.0

require (
	github.com/policyd/policyd/gen/go v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
)

// The stubs are developed in this repository. A release tags gen/go/vX.Y.Z
// and requires that version here (a worker's build ignores this replace).
replace github.com/policyd/policyd/gen/go => ../../../gen/go
