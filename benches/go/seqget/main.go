// Sequential keep-alive GETs with Go's net/http client, as kubelet sends them (its Accept and
// User-Agent), over HTTP/1.1 or HTTP/2; prints the p50 and p99 after 200 warm-up requests. Not
// run by the benches: a second client beside the process bench's own, for a held leg
// (OUTPOST_BENCH_HOLD) or the Go upstream itself (its client certificate flags), e.g.
//
//	go build -o /tmp/seqget benches/go/seqget/main.go
//	/tmp/seqget -url http://127.0.0.1:<leg port>/api/v1/nodes/edge-1
//	/tmp/seqget -url https://localhost:<upstream port>/api/v1/nodes/edge-1 -cert node.crt -key node.key -ca ca.crt -h2=false
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sort"
	"time"
)

const warmUp = 200

func main() {
	url := flag.String("url", "", "what to GET")
	cert := flag.String("cert", "", "client certificate (PEM), for an https URL")
	key := flag.String("key", "", "its key (PEM)")
	ca := flag.String("ca", "", "the server's CA (PEM)")
	h2 := flag.Bool("h2", true, "HTTP/2 over TLS when the server offers it; false: HTTP/1.1 only")
	n := flag.Int("n", 3000, "requests, warm-up included")
	flag.Parse()
	if *n <= warmUp {
		log.Fatalf("-n must be more than %d", warmUp)
	}
	client := &http.Client{Transport: transport(*cert, *key, *ca, *h2)}
	var took []time.Duration
	proto := ""
	for i := 0; i < *n; i++ {
		started := time.Now()
		proto = get(client, *url)
		if i >= warmUp {
			took = append(took, time.Since(started))
		}
	}
	sort.Slice(took, func(a, b int) bool { return took[a] < took[b] })
	fmt.Printf("%s p50 %d µs p99 %d µs\n", proto,
		took[len(took)/2].Microseconds(), took[len(took)*99/100].Microseconds())
}

func transport(cert, key, ca string, h2 bool) *http.Transport {
	tr := &http.Transport{ForceAttemptHTTP2: h2}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	if cert == "" {
		return tr
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(ca)
	if err != nil {
		log.Fatal(err)
	}
	roots.AppendCertsFromPEM(pem)
	tr.TLSClientConfig = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots}
	return tr
}

func get(client *http.Client, url string) string {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.kubernetes.protobuf,application/json")
	req.Header.Set("User-Agent", "kubelet/v1.32.4 (linux/amd64) kubernetes/bench")
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		log.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		log.Fatalf("%s answered %s", url, resp.Status)
	}
	return resp.Proto
}
