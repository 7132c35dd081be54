// A canned HTTPS "apiserver" for benches/proxy.rs: it answers from bodies read at start, so
// that the proxies in front of it, not the upstream, are what the bench measures. Client
// certificates are required and checked against the CA, as kube-apiserver does; HTTP/2 and
// HTTP/1.1 are offered by ALPN. Routes are `path=json-file[,protobuf-file]` arguments (the
// request's path, query ignored); the protobuf body answers a request whose Accept names
// `application/vnd.kubernetes.protobuf` first, as kube-apiserver negotiates; a watch (`watch=true`) is answered with headers and then held open; /healthz,
// /readyz and /livez answer "ok"; any other path a 404 Status. The listening address is
// printed on stdout's first line. Bodies are written as kube-apiserver's SerializeObject writes
// them: content type, status, the encoded object in one write, and no Content-Length, which
// net/http then declares only for a body that fits its first buffer (larger ones are chunked
// over HTTP/1.1, undeclared over HTTP/2).
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
)

const notFound = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404}`

func serialize(w http.ResponseWriter, mediaType string, body []byte) {
	w.Header().Set("Content-Type", mediaType)
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func main() {
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its key (PEM)")
	ca := flag.String("ca", "", "CA of the client certificates (PEM)")
	flag.Parse()
	bodies := map[string][]byte{}
	protobufs := map[string][]byte{}
	for _, route := range flag.Args() {
		i := strings.LastIndex(route, "=")
		if i < 0 {
			log.Fatalf("route %q: no '='", route)
		}
		files := strings.Split(route[i+1:], ",")
		for n, file := range files {
			body, err := os.ReadFile(file)
			if err != nil {
				log.Fatalf("route %q: %v", route, err)
			}
			if n == 0 {
				bodies[route[:i]] = body
			} else {
				protobufs[route[:i]] = body
			}
		}
	}
	caPEM, err := os.ReadFile(*ca)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/livez":
			w.Write([]byte("ok"))
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case protobufs[r.URL.Path] != nil && prefersProtobuf(r.Header.Get("Accept")):
			serialize(w, "application/vnd.kubernetes.protobuf", protobufs[r.URL.Path])
		case bodies[r.URL.Path] != nil:
			serialize(w, "application/json", bodies[r.URL.Path])
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(notFound))
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr())
	server := &http.Server{
		Handler:   handler,
		TLSConfig: &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool},
	}
	log.Fatal(server.ServeTLS(ln, *cert, *key))
}

// Whether the first media type of an Accept header is Kubernetes protobuf (kubelet's and
// kube-proxy's `application/vnd.kubernetes.protobuf,application/json`).
func prefersProtobuf(accept string) bool {
	first := strings.TrimSpace(strings.Split(strings.Split(accept, ",")[0], ";")[0])
	return first == "application/vnd.kubernetes.protobuf"
}
