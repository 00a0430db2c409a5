// Package iptables stands in for sigs.k8s.io/iptables-wrappers/pkg/iptables when the e2e builds
// Kubernetes 1.38 (tests/e2e/kubernetes/pin.sh puts it in with a replace directive): the module
// proxy serves that module's go.mod but not its source.
//
// It declares only what kubelet 1.38 uses (pkg/kubelet/kubelet_network_linux.go), and
// NewBestEffort finds no iptables at all, as on a host with nftables only: kubelet then logs
// "No iptables support on this system" and skips its KUBE-IPTABLES-HINT and KUBE-FIREWALL
// chains, which are for other components (kube-proxy, CNI plugins). The e2e cluster runs neither,
// and nothing flexd does touches packet filtering.
package iptables

import (
	"context"
	"time"
)

// Chain is an iptables chain's name.
type Chain string

// Table is an iptables table's name.
type Table string

// RulePosition says where EnsureRule puts a rule.
type RulePosition string

// Protocol is IPv4 or IPv6.
type Protocol string

// IPFamily keys NewBestEffort's clients.
type IPFamily string

// Mode chooses between iptables-legacy and iptables-nft.
type Mode int

const (
	// UseInstalledMode uses whichever iptables the host's own iptables command is.
	UseInstalledMode Mode = iota
)

const (
	Prepend RulePosition = "-I"
	Append  RulePosition = "-A"

	TableNAT    Table = "nat"
	TableFilter Table = "filter"
	TableMangle Table = "mangle"

	ChainInput  Chain = "INPUT"
	ChainOutput Chain = "OUTPUT"

	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"
)

// Interface is the part of the real package's client that kubelet calls.
type Interface interface {
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	IsIPv6() bool
	Protocol() Protocol
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

// NewBestEffort returns a client per IP family whose iptables works: none here.
func NewBestEffort(ctx context.Context, mode Mode) map[IPFamily]Interface {
	return map[IPFamily]Interface{}
}
