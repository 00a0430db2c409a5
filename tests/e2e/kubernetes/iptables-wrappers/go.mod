// A stand-in for sigs.k8s.io/iptables-wrappers v1.0.0, whose source the Go module proxy does not
// serve (its go.mod only). Kubernetes 1.38's kubelet imports it; nothing else the e2e builds
// does. See pkg/iptables/iptables.go for what it does instead.
module sigs.k8s.io/iptables-wrappers

go 1.26
