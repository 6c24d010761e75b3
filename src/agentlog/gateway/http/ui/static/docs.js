// The API docs page: Swagger UI (the assets the `swagger-ui-bundle` package ships, served from the
// package at /docs/...) over this server's OpenAPI document. Swagger UI reads OpenAPI 3.0, so it
// gets the 3.0 rendition of /openapi.json (/openapi-3.0.json). "Try it out" requests carry the
// token typed above (the same sessionStorage token as the run inspector), unless one was set with
// Swagger UI's own Authorize button.
"use strict";

function startDocs() {
  window.ui = SwaggerUIBundle({
    url: "/openapi-3.0.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    docExpansion: "list",
    defaultModelsExpandDepth: 0,
    tryItOutEnabled: true,
    requestInterceptor: (req) => {
      const token = sessionStorage.getItem(TOKEN_KEY);
      if (token && !req.headers.Authorization) req.headers.Authorization = "Bearer " + token;
      return req;
    },
  });
}

$("#token").value = sessionStorage.getItem(TOKEN_KEY) || "";
$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
});
startDocs();
