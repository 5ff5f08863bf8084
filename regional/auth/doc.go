// Package auth authenticates the clients of a controller's API: it turns an
// HTTP request into an Identity — who is calling, for which tenant, which
// data classes it may send and which class this request carries — or a
// typed refusal. Identity comes from a credential, never from a claim: the
// X-Tenant-Id and X-Data-Class headers are believed only from trusted
// gateways.
//
// # Modes (one per Authenticator)
//
//   - api_keys: the key travels as "Authorization: Bearer <key>" (what a
//     stock OpenAI SDK sends for its apiKey) or "X-Api-Key: <key>". The keys
//     file (YAML or JSON) holds, per key, its SHA-256 (hex of the digest of
//     the key text exactly as sent), a name, the tenant, the allowed data
//     classes, the default class and an optional rate limit; keys are never
//     stored in clear. Make keys with `meridian auth keygen` (32 random
//     bytes, base64url): a presented key shorter than 32 bytes is refused
//     before lookup. The digest of a presented key is compared with every
//     entry in constant time (crypto/subtle, no early exit). The file is
//     re-read every ReloadInterval and on Reload; an invalid file keeps the
//     previous set in use and is reported (error, log, metric).
//   - jwt: a bearer JWT signed with RS256, ES256 or EdDSA by a key of a JWKS
//     (file or https URL, refreshed periodically, and soon after a token
//     names an unknown kid); iss and aud must match, exp is required, nbf
//     and iat are checked, all with a small leeway. Configured claim names
//     map to the tenant, the allowed data classes and the default class.
//   - trusted_headers: the request comes from an authenticating gateway
//     recognised by its verified mTLS identity (global/identity) or by its
//     TCP peer address (CIDRs; never X-Forwarded-For), and X-Tenant-Id
//     (required) and X-Data-Class are taken from it.
//
// # Invariants
//
//   - Tenants and data classes are compared in lower case: they are
//     normalised when a keys file, a token or a header is read.
//   - In api_keys and jwt modes a client-sent X-Tenant-Id that differs from
//     the identity's tenant is refused (ErrTenantMismatch, 403), never
//     believed; X-Data-Class may only pick one of the identity's allowed
//     classes (ErrDataClassNotAllowed, 403). Without X-Data-Class the
//     request takes the identity's default class; with none configured
//     Identity.DataClass is "" and the caller applies its policy's strictest
//     treatment.
//   - Secrets shorter than 32 bytes are refused wherever they are parsed.
//
// Limiter is a token bucket per identity name (GCRA, bounded memory), for
// the caller to enforce Identity.RateLimit with a 429 and Retry-After.
//
// It imports global/identity and nothing else of Meridian's; it reads
// requests (net/http types) but serves nothing.
package auth
