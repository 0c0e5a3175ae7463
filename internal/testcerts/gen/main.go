// Command gen writes the test PKI (see package testcerts).
package main

import (
	"flag"
	"log"

	"github.com/talaris-go/talaris/internal/testcerts"
)

func main() {
	out := flag.String("out", "testdata", "directory to write the PEM files to")
	flag.Parse()
	if err := testcerts.Generate(*out); err != nil {
		log.Fatal(err)
	}
}
