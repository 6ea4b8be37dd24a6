package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// runCerts writes a CA, an apiserver serving certificate for the given host, an admin
// client certificate (O=system:masters) and a service-account signing key into --dir.
// With --user it instead issues one client certificate (user-NAME.crt/.key, with --groups
// as its organizations) from the CA already in --dir.
func runCerts(args []string) int {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	dir := fs.String("dir", "", "output directory (required)")
	host := fs.String("host", "127.0.0.1", "IP addresses the apiserver serves on, comma-separated (the first is the main one)")
	user := fs.String("user", "", "issue a client certificate for this user name from the CA in --dir")
	groups := fs.String("groups", "", "the user's groups, comma-separated (with --user)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "certs: --dir is required")
		return 2
	}
	if *user != "" {
		if err := writeUserCert(*dir, *user, *groups); err != nil {
			fmt.Fprintf(os.Stderr, "certs: %v\n", err)
			return 1
		}
		return 0
	}
	if err := writeCerts(*dir, *host); err != nil {
		fmt.Fprintf(os.Stderr, "certs: %v\n", err)
		return 1
	}
	return 0
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writeCerts(dir, host string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	caKey, err := newKey()
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "nodewright-test-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	if err := writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER); err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), caKey); err != nil {
		return err
	}
	issue := func(name string, serial int64, tmpl *x509.Certificate) error {
		key, err := newKey()
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = now
		tmpl.NotAfter = now.Add(10 * 365 * 24 * time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
			return err
		}
		return writeKey(filepath.Join(dir, name+".key"), key)
	}
	var ips []net.IP
	for _, h := range strings.Split(host, ",") {
		ip := net.ParseIP(h)
		if ip == nil {
			return fmt.Errorf("--host %q is not an IP address", h)
		}
		ips = append(ips, ip)
	}
	if err := issue("apiserver", 2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		IPAddresses: append(ips, net.ParseIP("10.0.0.1")),
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return err
	}
	if err := issue("admin", 3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "nodewright-admin", Organization: []string{"system:masters"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}
	saKey, err := newKey()
	if err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, "sa.key"), saKey)
}

// writeUserCert issues user-NAME.crt/.key for a client user signed by the CA in dir.
func writeUserCert(dir, user, groups string) error {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	var orgs []string
	if groups != "" {
		orgs = strings.Split(groups, ",")
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: user, Organization: orgs},
		NotBefore:    now,
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, pair.PrivateKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "user-"+user+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, "user-"+user+".key"), key)
}
