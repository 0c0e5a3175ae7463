module github.com/talaris-go/talaris/tests

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/gobwas/ws v1.5.0
	github.com/gorilla/websocket v1.5.3
	golang.org/x/sys v0.50.0
)

require github.com/talaris-go/talaris v0.0.0

require (
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.74.0
	github.com/talaris-go/talaris/internal/wstest v0.0.0
)

require (
	github.com/gobwas/httphead v0.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pandatix/go-abnf v0.5.5 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/talaris-go/talaris => ..

replace github.com/talaris-go/talaris/internal/wstest => ../internal/wstest
