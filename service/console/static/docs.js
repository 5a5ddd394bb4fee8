// Start Swagger UI (vendored swagger-ui-dist) on this service's OpenAPI document. A static file,
// not an inline script, so the page's Content-Security-Policy needs no 'unsafe-inline' script.
"use strict";
window.addEventListener("DOMContentLoaded", function () {
  window.ui = window.SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    // No call to the public validator (validator.swagger.io): the page works offline.
    validatorUrl: null,
    presets: [window.SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
