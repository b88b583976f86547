module github.com/leasehold/leasehold/conformance/adapters/go

go 1.19

require github.com/leasehold/leasehold/clients/go v0.0.0

replace github.com/leasehold/leasehold/clients/go => ../../../clients/go
