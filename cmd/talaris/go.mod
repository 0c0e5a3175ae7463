module github.com/talaris-go/talaris/cmd/talaris

go 1.26.0

require (
	github.com/HdrHistogram/hdrhistogram-go v1.4.0
	github.com/coder/websocket v1.8.15
	github.com/gobwas/ws v1.5.0
	github.com/gorilla/websocket v1.5.3
	github.com/lxzan/gws v1.8.9
	golang.org/x/sys v0.50.0
	gonum.org/v1/plot v0.17.0
)

require github.com/talaris-go/talaris v0.0.0

require github.com/talaris-go/talaris/internal/wstest v0.0.0

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/dolthub/maphash v0.1.0 // indirect
	github.com/gobwas/httphead v0.1.0 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/klauspost/compress v1.17.9 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/text v0.28.0 // indirect
)

replace github.com/talaris-go/talaris => ../..

replace github.com/talaris-go/talaris/internal/wstest => ../../internal/wstest
