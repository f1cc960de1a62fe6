// A registry that serves the OCI 1.1 referrers API, for the tests: go-containerregistry's
// pkg/registry (Debian's source) with referrers on, blobs kept in memory, on the address given.
package main

import (
	"log"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: referrers-registry 127.0.0.1:PORT")
	}
	log.Fatal(http.ListenAndServe(os.Args[1], registry.New(registry.WithReferrersSupport(true))))
}
