// Go's httputil.ReverseProxy, the core yurthub proxies with, alone: plain HTTP in, HTTPS out
// with the node's client certificate, keep-alive on both sides, bodies streamed as they come
// (FlushInterval -1). The listening address is printed on stdout's first line.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	upstream := flag.String("upstream", "", "https://host:port")
	cert := flag.String("cert", "", "client certificate (PEM)")
	key := flag.String("key", "", "its key (PEM)")
	ca := flag.String("ca", "", "the upstream's CA (PEM)")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(*cert, *key)
	if err != nil {
		log.Fatal(err)
	}
	caPEM, err := os.ReadFile(*ca)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	proxy.Transport = &http.Transport{
		TLSClientConfig:     &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: "localhost"},
		MaxIdleConnsPerHost: 32,
		ForceAttemptHTTP2:   true,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr())
	log.Fatal(http.Serve(ln, proxy))
}
